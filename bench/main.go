// Command bench measures agentconnect: session start latency, the memory of
// an idle shim, supervisor restart with many live sessions, the cost of
// `agentconnect exec`, and the srt strategy: exec of true next to Anthropic's
// sandbox-runtime (`srt true`) and a bare bwrap, the memory of an srt session,
// and many srt sessions started, stopped and removed at once with nothing
// left behind; and the microsandbox strategy under TCG with the serial
// transport: boot to the guest agent's answer, start to the first output
// byte, and the host memory of an idle VM session at several memoryMiB; and
// `agentconnect chat` of a real Codex against a fake model API on loopback,
// per strategy, to the first streamed token (needs npm). It
// prints a table of measured numbers next to their goals and never fails on
// a threshold (it exits 1 when a measurement fails, or when sessions leave
// something behind).
//
//	./scripts/bench-deps.sh   # the reference srt, into bin/tools/sandbox-runtime
//	make image                # the guest image, into bin/image
//	AGENTCONNECT_BIN=$PWD/bin go run ./bench [-n N | -quick] [-json] [-srt PATH] [-only host,srt,microsandbox]
//
// It starts its own daemon in a temporary home, under a child subreaper
// that reaps (the PID 1 of some machines does not, and shims are reparented
// to the nearest subreaper), and removes every session, the daemon and the
// home at the end.
package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/reaper"
)

// reapedEnv marks the re-executed child that does the work.
const reapedEnv = "AGENTCONNECT_BENCH_REAPED"

var (
	flagN     = flag.Int("n", 1, "divide every count by `N` for a quicker run")
	flagQuick = flag.Bool("quick", false, "a quick run: the same as -n 10")
	flagJSON  = flag.Bool("json", false, "also print the results as JSON")
	flagLog   = flag.String("daemon-log", "", "keep a copy of the daemon's log in `FILE`")
	flagSrt   = flag.String("srt", "", "`PATH` to the reference sandbox-runtime CLI (default: $AGENTCONNECT_BIN/tools/sandbox-runtime/node_modules/.bin/srt, where scripts/bench-deps.sh installs it)")
	flagOnly  = flag.String("only", "", "run only the measurements of these `GROUPS`, comma-separated: "+strings.Join(groups, ", ")+" (default: all)")
	flagMD    = flag.String("md", "", "also write the table as Markdown to `FILE` (make bench: BENCHMARKS.md)")
)

// groups name the sets of measurements -only selects.
var groups = []string{"host", "srt", "microsandbox", "chat"}

// selectedGroups returns the groups -only names, or all of them.
func selectedGroups() ([]string, error) {
	if *flagOnly == "" {
		return groups, nil
	}
	var out []string
	for _, g := range strings.Split(*flagOnly, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(groups, g) {
			return nil, fmt.Errorf("-only: unknown group %q; the groups are %s", g, strings.Join(groups, ", "))
		}
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out, nil
}

func main() {
	flag.Parse()
	if os.Getenv(reapedEnv) == "" {
		// This machine's PID 1 does not reap: run under a subreaper that
		// does, so that ended shims do not stay zombies.
		code, err := reaper.Reexec(reapedEnv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		os.Exit(code)
	}
	os.Exit(run())
}

// counts is how much each measurement does.
type counts struct {
	Starts          int `json:"starts"`          // session starts timed to the first byte
	Shims           int `json:"shims"`           // idle shims whose memory is read
	RestartSessions int `json:"restartSessions"` // live sessions during a supervisor restart
	Restarts        int `json:"restarts"`        // supervisor restarts
	Execs           int `json:"execs"`           // `agentconnect exec` runs (and bare fork+exec runs)
	SrtExecs        int `json:"srtExecs"`        // rounds of srt-strategy exec, srt and bwrap runs
	SrtSessions     int `json:"srtSessions"`     // idle srt sessions whose memory is read
	SrtConcurrent   int `json:"srtConcurrent"`   // srt sessions started, stopped and removed at once
	VMStarts        int `json:"vmStarts"`        // microsandbox starts timed to the first byte
	// VMMemoryMiB are the memoryMiB of the idle VM sessions whose host
	// memory is read, one session each.
	VMMemoryMiB []int `json:"vmMemoryMiB"`
	// VMDensity bounds the idle VM sessions started to fill the density
	// measurement's memory budget: above what the budget holds (~130 at
	// ~155 MiB each), so that the budget, not the bound, ends the count.
	VMDensity int `json:"vmDensity"`
}

func scaled() counts {
	n := *flagN
	if *flagQuick && n < 10 {
		n = 10
	}
	if n < 1 {
		n = 1
	}
	div := func(v, least int) int { return max(v/n, least) }
	return counts{
		Starts:          div(200, 10),
		Shims:           div(10, 2),
		RestartSessions: div(200, 10),
		Restarts:        div(3, 1),
		Execs:           div(50, 5),
		SrtExecs:        div(30, 5),
		SrtSessions:     div(10, 2),
		SrtConcurrent:   div(500, 10),
		VMStarts:        div(10, 3),
		VMMemoryMiB:     []int{512, 1024, 2048},
		VMDensity:       div(200, 4),
	}
}

// run is the re-executed child: it runs every measurement and prints them.
func run() int {
	binDir := os.Getenv("AGENTCONNECT_BIN")
	if binDir == "" {
		fmt.Fprintln(os.Stderr, "bench: set AGENTCONNECT_BIN to the directory holding agentconnect and agentconnect-shim (make build puts them in bin/)")
		return 2
	}
	binDir, _ = filepath.Abs(binDir)
	c := scaled()
	selected, err := selectedGroups()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-signals
		fmt.Fprintf(os.Stderr, "bench: %v: stopping after cleanup\n", sig)
		cancel()
	}()

	home, err := os.MkdirTemp("", "acbench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	d := &daemon{bin: binDir, home: home}
	defer os.RemoveAll(home)
	// Whatever the groups, so that the daemon (and its startup probes)
	// is the same in every run.
	config := vmConfig
	if hs, err := startInjectHosts(home); err == nil {
		d.inject = hs
		defer hs.close()
		config = strings.Replace(vmConfig, "{", fmt.Sprintf(`{"trustedCAFile":%q,`, hs.caFile), 1)
		// The chat measurement's API is trusted too: its CA after theirs.
		if api, err := startChatAPI(); err == nil {
			defer api.close()
			if f, err := os.OpenFile(hs.caFile, os.O_APPEND|os.O_WRONLY, 0); err == nil {
				if _, err := f.Write(api.caPEM); err == nil {
					d.chat = api
				}
				f.Close()
			}
		}
	}
	if err := os.WriteFile(filepath.Join(home, "config.json"), []byte(config), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if _, err := d.start(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		d.stop()
		return 1
	}
	if err := d.waitReady(ctx, 30*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		fmt.Fprint(os.Stderr, d.logTail(4096))
		d.stop()
		return 1
	}

	rep := &report{Machine: machineInfo(ctx, d), Counts: c, Groups: selected}
	begin := time.Now()
	steps := []struct {
		group, name string
		fn          func(context.Context, *daemon, counts, *report) error
	}{
		{"host", "session start to first byte", benchStartLatency},
		{"host", "idle shim memory", benchShimMemory},
		{"host", "supervisor restart", benchRestart},
		{"host", "exec", benchExec},
		{"host", "warm host boundaries", benchWarmHost},
		{"srt", "srt exec vs sandbox-runtime vs bwrap", benchSrtExec},
		{"srt", "warm srt boundaries", benchWarmSrt},
		{"srt", "srt session memory", benchSrtMemory},
		{"srt", "concurrent srt sessions", benchSrtConcurrent},
		{"srt", "srt secret injection", benchSrtInject},
		{"microsandbox", "microsandbox start", benchVMStart},
		{"microsandbox", "warm microsandbox VMs", benchWarmVM},
		{"microsandbox", "microsandbox session memory", benchVMMemory},
		{"microsandbox", "idle VMs in 20 GiB", benchVMDensity},
		{"microsandbox", "guest image", benchImage},
		{"chat", "chat to the first streamed token", benchChat},
	}
	if err := d.createAgent(ctx); err != nil {
		rep.Errors = append(rep.Errors, "create the bench agent: "+err.Error())
		steps = nil
	} else {
		d.srtUnavailable = d.createSrtAgent(ctx)
		d.vmUnavailable = d.createVMAgents(ctx, c)
	}
	for _, s := range steps {
		if !slices.Contains(selected, s.group) {
			continue
		}
		if ctx.Err() != nil {
			rep.Errors = append(rep.Errors, s.name+": skipped (interrupted)")
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s...\n", s.name)
		t := time.Now()
		if err := s.fn(ctx, d, c, rep); err != nil {
			rep.Errors = append(rep.Errors, s.name+": "+err.Error())
		}
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, time.Since(t).Round(time.Millisecond))
	}
	rep.Took = time.Since(begin).Round(time.Millisecond).String()

	if leftovers := d.stop(); leftovers != "" {
		rep.Errors = append(rep.Errors, "cleanup: "+leftovers)
	}
	rep.DaemonLog = d.checkLog()
	if *flagLog != "" {
		if err := os.WriteFile(*flagLog, []byte(d.logFrom(0)), 0o644); err != nil {
			rep.Errors = append(rep.Errors, "keep the daemon log: "+err.Error())
		}
	}
	rep.print(os.Stdout)
	if *flagMD != "" {
		if err := rep.writeMarkdown(*flagMD); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
	}
	if *flagJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		enc.Encode(rep)
	}
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// machine describes where the numbers were taken.
type machine struct {
	Nproc           int    `json:"nproc"`
	CPU             string `json:"cpu"`
	Kernel          string `json:"kernel"`
	GoVersion       string `json:"goVersion"`
	Agentconnect    string `json:"agentconnect"`
	Strategies      string `json:"strategies"`
	MemTotalMiB     int    `json:"memTotalMiB"`
	ShimBinaryMiB   string `json:"shimBinaryMiB"`
	VMShimBinaryMiB string `json:"vmShimBinaryMiB"`
	ShimLinking     string `json:"shimLinking"`
	SupervisorPath  string `json:"supervisorPath"`
}

func machineInfo(ctx context.Context, d *daemon) machine {
	m := machine{Nproc: runtime.NumCPU(), GoVersion: runtime.Version(), SupervisorPath: d.path("agentconnect")}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			m.MemTotalMiB = kb / 1024
		}
	}
	if fi, err := os.Stat(d.path("agentconnect-shim")); err == nil {
		m.ShimBinaryMiB = fmt.Sprintf("%.1f", float64(fi.Size())/(1<<20))
	}
	if fi, err := os.Stat(d.path("agentconnect-shim-vm")); err == nil {
		m.VMShimBinaryMiB = fmt.Sprintf("%.1f", float64(fi.Size())/(1<<20))
	}
	m.ShimLinking = "static"
	if f, err := elf.Open(d.path("agentconnect-shim")); err == nil {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				m.ShimLinking = "dynamically linked (cgo: libc is mapped into every shim)"
			}
		}
		f.Close()
	}
	if a, err := d.dialAdmin(); err == nil {
		if st, err := a.Status(ctx, nil); err == nil {
			m.Agentconnect = st.Version
			var avail []string
			for _, s := range st.Strategies {
				if s.Available {
					avail = append(avail, s.Name)
				} else {
					avail = append(avail, s.Name+" (unavailable)")
				}
			}
			m.Strategies = strings.Join(avail, ", ")
		}
		a.Close()
	}
	return m
}

// row is one measured number.
type row struct {
	Measurement string  `json:"measurement"`
	Stat        string  `json:"stat"`
	Value       float64 `json:"value"`
	Unit        string  `json:"unit"`
	Goal        string  `json:"goal,omitempty"`
	Met         *bool   `json:"met,omitempty"`
	Reference   string  `json:"reference,omitempty"`
}

type report struct {
	Machine machine  `json:"machine"`
	Counts  counts   `json:"counts"`
	Groups  []string `json:"groups"`
	Rows    []row    `json:"results"`
	Errors  []string `json:"errors,omitempty"`
	// DaemonLog holds the daemon's warnings and errors, counted.
	DaemonLog []string `json:"daemonLog,omitempty"`
	Took      string   `json:"took"`
}

// add records a value; goalMax > 0 is an upper bound the value is compared
// with (reported, never enforced).
func (r *report) add(measurement, stat string, value float64, unit string, goalMax float64, reference string) {
	rw := row{Measurement: measurement, Stat: stat, Value: value, Unit: unit, Reference: reference}
	if goalMax > 0 {
		met := value <= goalMax
		rw.Met = &met
		rw.Goal = "<= " + formatValue(goalMax, unit)
	}
	r.Rows = append(r.Rows, rw)
}

// addGoal records a value with a goal that is not a bound: text only.
func (r *report) addGoal(measurement, stat string, value float64, unit, goal, reference string) {
	r.Rows = append(r.Rows, row{Measurement: measurement, Stat: stat, Value: value, Unit: unit, Goal: goal, Reference: reference})
}

// note records a row that carries text only.
func (r *report) note(measurement, stat, text string) {
	r.Rows = append(r.Rows, row{Measurement: measurement, Stat: stat, Value: 0, Unit: "", Reference: text})
}

func formatValue(v float64, unit string) string {
	switch {
	case unit == "":
		return ""
	case unit == "x" && v < 1:
		return fmt.Sprintf("%.3f x", v)
	case unit == "x":
		return fmt.Sprintf("%.1f x", v)
	case v >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	case v >= 10:
		return fmt.Sprintf("%.1f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

func (r *report) print(f *os.File) {
	m := r.Machine
	fmt.Fprintln(f)
	fmt.Fprintf(f, "machine:      %d CPUs (%s), %d MiB RAM\n", m.Nproc, m.CPU, m.MemTotalMiB)
	fmt.Fprintf(f, "kernel:       %s\n", m.Kernel)
	fmt.Fprintf(f, "go:           %s\n", m.GoVersion)
	fmt.Fprintf(f, "agentconnect: %s (%s)\n", m.Agentconnect, m.SupervisorPath)
	fmt.Fprintf(f, "shim binary:  %s MiB (host, srt), %s MiB (microsandbox), %s\n", m.ShimBinaryMiB, m.VMShimBinaryMiB, m.ShimLinking)
	fmt.Fprintf(f, "strategies:   %s\n", m.Strategies)
	c := r.Counts
	byGroup := map[string]string{
		"host": fmt.Sprintf("host: %d starts, %d idle shims, %d sessions x %d restarts, %d execs",
			c.Starts, c.Shims, c.RestartSessions, c.Restarts, c.Execs),
		"srt":          fmt.Sprintf("srt: %d exec rounds, %d idle sessions, %d concurrent", c.SrtExecs, c.SrtSessions, c.SrtConcurrent),
		"microsandbox": fmt.Sprintf("microsandbox: %d starts, one idle session at each memoryMiB of %v, up to %d idle VMs in 20 GiB", c.VMStarts, c.VMMemoryMiB, c.VMDensity),
	}
	var ran []string
	for _, g := range r.Groups {
		ran = append(ran, byGroup[g])
	}
	fmt.Fprintf(f, "counts:       %s (took %s)\n\n", strings.Join(ran, "; "), r.Took)

	width := 0
	for _, rw := range r.Rows {
		width = max(width, len(formatValue(rw.Value, rw.Unit)))
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "MEASUREMENT\tSTAT\t%*s\tGOAL\t\tREFERENCE / NOTE\n", width, "VALUE")
	last := ""
	for _, rw := range r.Rows {
		name := rw.Measurement
		if name == last {
			name = ""
		} else if last != "" {
			fmt.Fprintln(tw, "\t\t\t\t\t")
		}
		last = rw.Measurement
		verdict := ""
		if rw.Met != nil {
			verdict = "met"
			if !*rw.Met {
				verdict = "MISSED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%*s\t%s\t%s\t%s\n", name, rw.Stat, width, formatValue(rw.Value, rw.Unit), rw.Goal, verdict, rw.Reference)
	}
	tw.Flush()
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		fmt.Fprintln(f, strings.TrimRight(line, " "))
	}
	if len(r.DaemonLog) > 0 {
		fmt.Fprintln(f, "\ndaemon log warnings and errors:")
		for _, e := range r.DaemonLog {
			fmt.Fprintln(f, "  "+e)
		}
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(f, "\nerrors:")
		for _, e := range r.Errors {
			fmt.Fprintln(f, "  "+e)
		}
	}
	fmt.Fprintln(f)
}

// writeMarkdown writes the report as BENCHMARKS.md: where and how it was
// measured, then every row with its goal and reference.
func (r *report) writeMarkdown(path string) error {
	var b strings.Builder
	m := r.Machine
	cmd := "make bench"
	if len(os.Args) > 1 {
		cmd += " (go run ./bench " + strings.Join(os.Args[1:], " ") + ")"
	}
	fmt.Fprintf(&b, "# Benchmarks\n\nWritten by `%s` on %s; the table is the bench's own, row for row. Goals are reported, never enforced.\n\n",
		cmd, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&b, "- machine: %d CPUs (%s), %d MiB RAM; %s\n", m.Nproc, m.CPU, m.MemTotalMiB, m.Kernel)
	fmt.Fprintf(&b, "- agentconnect %s, %s; shim binaries %s MiB (host, srt) and %s MiB (microsandbox), %s\n", m.Agentconnect, m.GoVersion, m.ShimBinaryMiB, m.VMShimBinaryMiB, m.ShimLinking)
	fmt.Fprintf(&b, "- strategies: %s; groups run: %s; took %s\n\n", m.Strategies, strings.Join(r.Groups, ", "), r.Took)
	b.WriteString("| measurement | stat | value | goal | verdict | reference / note |\n|---|---|---:|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }
	for _, rw := range r.Rows {
		verdict := ""
		if rw.Met != nil {
			verdict = "met"
			if !*rw.Met {
				verdict = "MISSED"
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", cell(rw.Measurement), cell(rw.Stat), formatValue(rw.Value, rw.Unit), cell(rw.Goal), verdict, cell(rw.Reference))
	}
	if len(r.Errors) > 0 {
		b.WriteString("\nErrors:\n\n")
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "- %s\n", cell(e))
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
