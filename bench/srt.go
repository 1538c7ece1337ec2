package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// srtAgent is the agent of the srt measurements: the srt strategy, a
// runtime of /bin/true (the measurements pass their own command).
const srtAgent = "bench-srt"

// bareBwrapArgs is the reference boundary: bubblewrap alone, nothing of
// ours around it.
var bareBwrapArgs = []string{"--unshare-all", "--die-with-parent", "--new-session",
	"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true"}

// srtSettings is the reference srt's settings file: no network, the working
// directory writable, like an agentconnect srt agent with no allowed domain.
const srtSettings = `{
  "network": {"allowedDomains": [], "deniedDomains": []},
  "filesystem": {"denyRead": [], "allowWrite": ["."], "denyWrite": []}
}
`

// createSrtAgent creates the srt agent when the daemon offers the srt
// strategy. It returns why the srt measurements cannot run, or "".
func (d *daemon) createSrtAgent(ctx context.Context) string {
	a, err := d.dialAdmin()
	if err != nil {
		return err.Error()
	}
	defer a.Close()
	if why := strategyUnavailable(ctx, a, "srt"); why != "" {
		return why
	}
	agent, err := a.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: &adminv1.Agent{
		Name: srtAgent, Strategy: "srt", Command: trueCommand,
	}})
	if err != nil {
		return "create the srt agent: " + err.Error()
	}
	// What the agent's directory holds before any session: what a run
	// leaves there (placeholders of protected names) is the difference.
	d.srtAgentDir = agent.Dir
	d.srtBaseline = leftovers.AgentTree(agent.Dir)
	return ""
}

var trueCommand = []string{"/bin/true"}

// strategyUnavailable says why the daemon cannot run sessions of a
// strategy, or is "".
func strategyUnavailable(ctx context.Context, a *admin, name string) string {
	st, err := a.Status(ctx, &adminv1.StatusRequest{})
	if err != nil {
		return "status: " + err.Error()
	}
	for _, s := range st.Strategies {
		if s.Name == name {
			if !s.Available {
				return "the daemon cannot run " + name + " here: " + s.Reason
			}
			return ""
		}
	}
	return "the daemon has no " + name + " strategy"
}

// refSrt is the reference sandbox-runtime CLI, ready to run `true`.
type refSrt struct {
	path, settings, dir string
	version             string // "@anthropic-ai/sandbox-runtime 0.0.83 on node v20.1.2"
	maxRSSKiB           int64  // the largest max RSS of a timed run
}

// findRefSrt locates the reference srt (-srt, else where
// scripts/bench-deps.sh installs it), writes its settings and working
// directory into the bench home and runs `srt true` once. It returns why
// srt cannot be measured, or "".
func findRefSrt(ctx context.Context, d *daemon) (*refSrt, string) {
	path := *flagSrt
	if path == "" {
		path = filepath.Join(d.bin, "tools", "sandbox-runtime", "node_modules", ".bin", "srt")
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Sprintf("%s is not installed (run scripts/bench-deps.sh): %v", path, err)
	}
	r := &refSrt{path: path, settings: filepath.Join(d.home, "srt-settings.json"), dir: filepath.Join(d.home, "srt-cwd")}
	if err := os.WriteFile(r.settings, []byte(srtSettings), 0o644); err != nil {
		return nil, err.Error()
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err.Error()
	}
	r.version = "@anthropic-ai/sandbox-runtime"
	if real, err := filepath.EvalSymlinks(path); err == nil {
		// node_modules/@anthropic-ai/sandbox-runtime/dist/cli.js
		if data, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(real)), "package.json")); err == nil {
			var pkg struct{ Version string }
			if json.Unmarshal(data, &pkg) == nil && pkg.Version != "" {
				r.version += " " + pkg.Version
			}
		}
	}
	if out, err := exec.CommandContext(ctx, "node", "--version").Output(); err == nil {
		r.version += " on node " + strings.TrimSpace(string(out))
	}
	if err := r.run(ctx); err != nil {
		return nil, err.Error()
	}
	return r, ""
}

// run runs `srt --settings FILE true` in its working directory.
func (r *refSrt) run(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, r.path, "--settings", r.settings, "true")
	cmd.Dir = r.dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if cmd.ProcessState != nil {
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			r.maxRSSKiB = max(r.maxRSSKiB, ru.Maxrss)
		}
	}
	if err != nil {
		return fmt.Errorf("srt --settings %s true: %v: %s", r.settings, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// benchSrtExec times `agentconnect exec` of true in an srt agent, the
// reference `srt true` and a bare bwrap of true, interleaved round by round
// so that all three see the same machine.
func benchSrtExec(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m = "exec true: srt strategy vs sandbox-runtime vs bwrap"
	if d.srtUnavailable != "" {
		rep.note(m, "agentconnect exec (srt)", "unavailable: "+d.srtUnavailable)
		return nil
	}
	ref, why := findRefSrt(ctx, d)
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()

	type contender struct {
		name string
		run  func() error
		t    samples
	}
	acExec := &contender{name: "agentconnect exec", run: func() error { return d.runCLI(ctx, "exec", srtAgent, "--", "true") }}
	viaAPI := &contender{name: "admin API start+wait+rm", run: func() error { return startWaitRemove(ctx, a, srtAgent, []string{"true"}) }}
	bwrap := &contender{name: "bare bwrap", run: func() error {
		out, err := exec.CommandContext(ctx, "bwrap", bareBwrapArgs...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("bwrap %s: %v: %s", strings.Join(bareBwrapArgs, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}}
	contenders := []*contender{acExec, viaAPI, bwrap}
	var srt *contender
	if ref != nil {
		srt = &contender{name: "srt", run: func() error { return ref.run(ctx) }}
		contenders = append(contenders, srt)
	}
	for i := 0; i < execWarmup+c.SrtExecs; i++ {
		for _, k := range contenders {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t0 := time.Now()
			err := k.run()
			took := time.Since(t0)
			if err != nil && k == srt {
				// The reference failed after it had worked: report the
				// others and why srt is missing.
				why, srt, contenders = err.Error(), nil, contenders[:len(contenders)-1]
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			if i >= execWarmup {
				k.t.add(took)
			}
		}
	}

	n := fmt.Sprintf("median of %d, interleaved, after %d warm-up rounds", len(acExec.t), execWarmup)
	ac := acExec.t.median()
	rep.add(m, "agentconnect exec (srt)", ac, "ms", 0, n)
	rep.add(m, "agentconnect exec (srt) p90", acExec.t.percentile(90), "ms", 0, "")
	rep.add(m, "admin API start+wait+rm (srt)", viaAPI.t.median(), "ms", 0, "the same session without the CLI process")
	if srt != nil {
		rep.add(m, "srt true", srt.t.median(), "ms", 0, fmt.Sprintf("%s; max RSS %.0f MiB", ref.version, float64(ref.maxRSSKiB)/1024))
	} else {
		rep.note(m, "srt true", "unavailable: "+why)
	}
	rep.add(m, "bare bwrap true", bwrap.t.median(), "ms", 0, "bwrap "+strings.Join(bareBwrapArgs, " "))
	if srt != nil {
		rep.add(m, "ratio agentconnect / srt", ac/srt.t.median(), "x", 1.0/20, fmt.Sprintf("agentconnect is %.1f times as fast as srt; the goal is 20", srt.t.median()/ac))
		rep.Rows[len(rep.Rows)-1].Goal = "<= 1/20"
	} else {
		rep.note(m, "ratio agentconnect / srt", "unavailable: no srt time")
	}
	rep.add(m, "ratio agentconnect / bwrap", ac/bwrap.t.median(), "x", 2, "")
	return srtSteps(ctx, d, a, c, rep)
}

// srtSteps reports where a cold srt start's time goes inside the shim, from
// the steps of its "runtime started" log line, over a few starts of true.
func srtSteps(ctx context.Context, d *daemon, a *admin, c counts, rep *report) error {
	const m = "srt cold start: the shim's steps"
	names := []string{"boundary", "exec", "sandbox"}
	got := map[string]*samples{}
	for _, name := range names {
		got[name] = &samples{}
	}
	for range c.SrtExecs {
		s, err := a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: srtAgent, Command: []string{"true"}})
		if err != nil {
			return fmt.Errorf("%s: start session: %w", m, err)
		}
		steps, err := runtimeSteps(d, s.Id)
		if _, werr := a.WaitSession(ctx, &adminv1.WaitSessionRequest{Id: s.Id}); werr != nil && err == nil {
			err = werr
		}
		if _, rerr := a.RemoveSession(ctx, &adminv1.RemoveSessionRequest{Id: s.Id}); rerr != nil && err == nil {
			err = rerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		for _, name := range names {
			dur, ok := steps[name]
			if !ok {
				return fmt.Errorf("%s: session %s: no %q in its shim's steps", m, s.Id, name)
			}
			got[name].add(dur)
		}
	}
	for _, name := range names {
		rep.add(m, name, got[name].median(), "ms", 0, fmt.Sprintf("median of %d starts of true, one at a time", len(*got[name])))
	}
	return nil
}
