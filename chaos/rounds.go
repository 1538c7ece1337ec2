package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/protect"
)

// rounds plays rounds until deadline and returns the first violation, or
// "". The counters start before the first round and live through all.
func (c *chaos) rounds(deadline time.Time) string {
	// What the agents' directories hold before any session: a round may
	// add only placeholders the ledger records (they go with the last
	// boundary), and nothing may be left at the end.
	c.agentTrees = map[string]map[string]string{}
	for _, strategy := range c.strategies() {
		name := agentOf[strategy]
		var a struct {
			Dir string `json:"dir"`
		}
		r := c.retry("agent", "show", name, "--json")
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &a) != nil || a.Dir == "" {
			return fmt.Sprintf("agent show %s: exit %d: %s", name, r.code, strings.TrimSpace(r.stderr))
		}
		c.agentTrees[a.Dir] = leftovers.AgentTree(a.Dir)
	}
	for _, strategy := range []string{"host", "srt"} {
		j := &job{name: "chaos-counter-" + strategy, strategy: strategy, kind: counter}
		if c.start(j); j.id == "" {
			return fmt.Sprintf("start the %s counter: %s", strategy, j.startErr)
		}
		c.counters = append(c.counters, j)
		c.add("sessions", 1)
	}
	// The disk fills once, in a round chosen now (the second to the fourth).
	fullRound := 2 + c.rng.IntN(3)
	for time.Now().Before(deadline) && !c.interrupt.Load() {
		c.round++
		t0 := time.Now()
		p := c.plan(c.round == fullRound)
		if failure := c.play(p); failure != "" {
			return fmt.Sprintf("round %d (%s)\n  faults: %s\n  violation: %s", c.round, p.sessions(), p.faults(), failure)
		}
		fmt.Printf("round %d: %s; faults: %s; %v: ok\n", c.round, p.sessions(), p.faults(), time.Since(t0).Round(100*time.Millisecond))
	}
	return ""
}

// plan is one round: its jobs and the faults around them.
type plan struct {
	jobs      []*job
	kills     []time.Duration // moments of supervisor SIGKILLs after the round starts
	downtimes []time.Duration // how long the supervisor stays down after each
	fullDisk  bool
	fillAt    time.Duration // when the disk fills, after the round starts; it stays full diskFullFor
	refused   int           // starts refused on the full disk
	refusal   string        // the first refusal's words
	filled    string        // how much the fill took
}

func (p *plan) sessions() string {
	n := map[string]int{}
	for _, j := range p.jobs {
		n[j.strategy]++
	}
	var parts []string
	for _, s := range []string{"host", "srt", "microsandbox"} {
		if n[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[s], s))
		}
	}
	return fmt.Sprintf("%d sessions (%s)", len(p.jobs), strings.Join(parts, ", "))
}

func (p *plan) faults() string {
	var parts []string
	for i, at := range p.kills {
		parts = append(parts, fmt.Sprintf("supervisor SIGKILL at %v, down %v", at.Round(time.Millisecond), p.downtimes[i].Round(time.Millisecond)))
	}
	for _, j := range p.jobs {
		if j.kind != normal {
			mark := ""
			if !j.landed && j.kind != counter {
				mark = " (it ended first)"
			}
			parts = append(parts, j.kind.String()+" "+j.name+mark)
		}
	}
	if p.fullDisk {
		parts = append(parts, fmt.Sprintf("disk full at %v for %v (%s), %d starts refused", p.fillAt, diskFullFor, p.filled, p.refused))
		if p.refusal != "" {
			parts = append(parts, "the first refusal said: "+p.refusal)
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

func (c *chaos) plan(fullDisk bool) *plan {
	p := &plan{fullDisk: fullDisk}
	add := func(strategy string, kinds []kind) {
		j := &job{
			name:     fmt.Sprintf("chaos-r%d-j%d", c.round, len(p.jobs)+1),
			strategy: strategy,
			kind:     kinds[c.rng.IntN(len(kinds))],
			lines:    5 + c.rng.IntN(40),
			delay:    []string{"0", "0.01", "0.03"}[c.rng.IntN(3)],
			exit:     []int{0, 1, 7, 42}[c.rng.IntN(4)],
		}
		if j.kind == killRuntime || j.kind == killShim {
			j.lines, j.delay = 100+c.rng.IntN(100), "0.02" // still running when the kill comes
			j.strikeAfter = time.Duration(200+c.rng.IntN(600)) * time.Millisecond
		}
		p.jobs = append(p.jobs, j)
	}
	local := []kind{normal, normal, killRuntime, killShim, stopRace}
	for i := 1 + c.rng.IntN(3); i > 0; i-- {
		add("host", local)
	}
	for i := 1 + c.rng.IntN(3); i > 0; i-- {
		add("srt", local)
	}
	if c.vmOK && c.round%*flagVMEvery == 0 {
		// No runtime kill in a VM: its runtime is the guest's process.
		add("microsandbox", []kind{normal, killShim, stopRace})
	}
	for i := c.rng.IntN(3); i > 0; i-- {
		p.kills = append(p.kills, time.Duration(c.rng.IntN(2500))*time.Millisecond)
		p.downtimes = append(p.downtimes, time.Duration(c.rng.IntN(500))*time.Millisecond)
	}
	slices.Sort(p.kills)
	if fullDisk {
		p.fillAt = time.Duration(c.rng.IntN(800)) * time.Millisecond
	}
	return p
}

// diskFullFor is how long the disk stays full in its round.
const diskFullFor = 2 * time.Second

// play runs a round and checks every invariant after it.
func (c *chaos) play(p *plan) string {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	fail := func(err error) {
		mu.Lock()
		problems = append(problems, err.Error())
		mu.Unlock()
	}
	if p.fullDisk {
		// The disk fills while sessions start and run, and frees again.
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(p.fillAt)
			n, err := c.loop.fill()
			if err != nil {
				fail(fmt.Errorf("fill the home's disk: %v", err))
			}
			p.filled = fmt.Sprintf("%d MiB written", n>>20)
			time.Sleep(diskFullFor)
			if err := c.loop.free(); err != nil {
				fail(fmt.Errorf("free the home's disk: %v", err))
			}
		}()
	}
	// Supervisor SIGKILLs, one after another, each restarted after its
	// downtime.
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		for i, at := range p.kills {
			time.Sleep(time.Until(t0.Add(at)))
			c.killDaemon()
			c.add("supervisor SIGKILLs", 1)
			time.Sleep(p.downtimes[i])
			if err := c.startDaemon(); err != nil {
				fail(fmt.Errorf("restart the supervisor after SIGKILL %d: %v", i+1, err))
				return
			}
		}
	}()
	for _, j := range p.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			startDone := make(chan struct{})
			var raced sync.WaitGroup
			if j.kind == stopRace {
				raced.Add(1)
				go func() {
					defer raced.Done()
					if err := c.stopRacing(j, startDone); err != nil {
						fail(err)
					}
				}()
			}
			c.start(j)
			close(startDone)
			raced.Wait()
			if j.id == "" {
				return
			}
			switch j.kind {
			case killRuntime, killShim:
				if err := c.strike(j); err != nil {
					fail(err)
				}
			}
		}()
	}
	wg.Wait()
	if len(problems) > 0 {
		return strings.Join(problems, "; ")
	}
	if c.daemonPID() == 0 {
		return "the supervisor is down after the round's faults"
	}
	if failure := c.settle(p); failure != "" {
		return failure
	}
	return c.check(p)
}

// landedName counts a fault that reached its session.
var landedName = map[kind]string{killRuntime: "runtimes killed", killShim: "shims killed", stopRace: "stops racing starts"}

// settle accounts for every start: a refused start must have said why and
// left no session; an ambiguous one is found by name, or must not exist.
func (c *chaos) settle(p *plan) string {
	for _, j := range p.jobs {
		if j.landed && landedName[j.kind] != "" {
			c.add(landedName[j.kind], 1)
		}
		if j.id != "" {
			c.add("sessions", 1)
			continue
		}
		id, err := c.findByName(j.name)
		if err != nil {
			return err.Error()
		}
		switch {
		case j.startErr != "" && p.fullDisk && strings.Contains(j.startErr, "no space left on device"):
			if p.refused++; p.refusal == "" {
				p.refusal = j.startErr
			}
			c.add("starts refused on a full disk", 1)
			if id != "" {
				// The record may stay to show the failure; it must not run.
				j.id = id
			}
		case j.startErr != "" && j.kind == stopRace && id != "":
			j.id = id // stopped before its start answered
		case j.startErr != "":
			return fmt.Sprintf("%s: its start failed: %s", j, j.startErr)
		case j.ambig && id != "":
			j.id = id
		}
		if j.id != "" {
			c.add("sessions", 1)
		}
	}
	return ""
}

// check waits for every session of the round to end and checks it, removes
// them, and checks what they left, the state files and the counters.
func (c *chaos) check(p *plan) string {
	var ids []string
	var roots []string
	for _, j := range p.jobs {
		if j.id == "" {
			continue
		}
		bound := time.Minute
		if j.strategy == "microsandbox" {
			bound = 3 * time.Minute
		}
		s, err := c.waitEnded(j, bound)
		if err != nil {
			return err.Error()
		}
		if j.startErr != "" && s.State == "exited" && s.ExitCode == 0 && j.kind != stopRace {
			return fmt.Sprintf("%s: its start failed (%s), yet it ran and exited 0", j, j.startErr)
		}
		if j.startErr == "" {
			if err := c.judge(j, s, p.fullDisk); err != nil {
				return err.Error()
			}
		}
		if roots == nil {
			roots = leftovers.CgroupRoots(s.Cgroup)
			if c.cgroupRoots == nil {
				c.cgroupRoots = roots
			}
		}
		if left := c.waitRunGone(j.id); left != "" {
			return fmt.Sprintf("%s ended, and its run left %s", j, left)
		}
		if log, _ := os.ReadFile(filepath.Join(home.Layout{Root: c.home}.SessionDir(j.id), "shim.log")); strings.Contains(string(log), "warm boundary claimed") {
			c.add("sessions on a warm boundary", 1)
		}
		ids = append(ids, j.id)
	}
	for _, id := range ids {
		if r := c.retry("session", "rm", id); r.code != 0 {
			return fmt.Sprintf("session rm %s: exit %d: %s", id, r.code, strings.TrimSpace(r.stderr))
		}
		layout := home.Layout{Root: c.home}
		for _, dir := range []string{layout.SessionDir(id), filepath.Join(layout.VMsDir(), id)} {
			if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Sprintf("session %s was removed, and %s is still there (%v)", id, dir, err)
			}
		}
	}
	removed := map[string]bool{}
	for _, id := range ids {
		removed[id] = true
	}
	if left := leftovers.SessionCgroups(roots, removed); len(left) > 0 {
		return "cgroups of removed sessions: " + leftovers.Brief(left, 4)
	}
	if left := leftovers.MountsUnder(c.home); len(left) > 0 {
		return "mounts under the home: " + leftovers.Brief(left, 4)
	}
	if left := c.leftProcesses(c.counters, 10*time.Second); left != "" {
		return left
	}
	if left := c.agentLeftovers(true); left != "" {
		return left
	}
	if err := c.checkStateFiles(); err != nil {
		return err.Error()
	}
	if err := c.checkCounters(); err != nil {
		return err.Error()
	}
	r := c.cli(adminBound, "status", "--json")
	if r.code != 0 {
		return fmt.Sprintf("status did not answer within %v: exit %d: %s", adminBound, r.code, strings.TrimSpace(r.stderr))
	}
	return ""
}

// agentLeftovers lists what the sessions added to the agents' directories;
// with ledger, not the placeholders the placeholder ledger still records
// (a boundary that runs may have them bound).
func (c *chaos) agentLeftovers(ledger bool) string {
	recorded := map[string]bool{}
	if ledger {
		var d struct {
			Placeholders []struct{ Root, Rel string } `json:"placeholders"`
		}
		data, err := os.ReadFile(protect.LedgerPath(c.home))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "read the placeholder ledger: " + err.Error()
		}
		if len(data) > 0 {
			if err := json.Unmarshal(data, &d); err != nil {
				return "the placeholder ledger does not parse: " + err.Error()
			}
		}
		for _, p := range d.Placeholders {
			recorded[filepath.Join(p.Root, p.Rel)] = true
		}
	}
	for dir, before := range c.agentTrees {
		var added []string
		for _, p := range leftovers.NewPaths(before, leftovers.AgentTree(dir)) {
			if !recorded[filepath.Join(dir, strings.Fields(p)[0])] {
				added = append(added, p)
			}
		}
		if len(added) > 0 {
			return fmt.Sprintf("the agent directory %s has paths its sessions left: %s", dir, leftovers.Brief(added, 4))
		}
	}
	return ""
}

// waitRunGone waits up to 10 s for what an ended run must take with it
// (its cgroups, shim socket, VM socket directory) to go.
func (c *chaos) waitRunGone(id string) string {
	var left []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if left = leftovers.Run(c.home, id); len(left) == 0 {
			return ""
		}
	}
	return leftovers.Brief(left, 4)
}

// leftProcesses lists, after up to grace, the processes of the daemon and
// its sessions other than the daemon itself and keep's shims with theirs.
func (c *chaos) leftProcesses(keep []*job, grace time.Duration) string {
	var skip []int
	for _, j := range keep {
		if s, err := c.show(j.id); err == nil && s.ShimPID > 0 {
			skip = append(skip, s.ShimPID)
		}
	}
	var left []string
	for deadline := time.Now().Add(grace); ; time.Sleep(50 * time.Millisecond) {
		left = left[:0]
		procs := leftovers.ReadProcs()
		children := leftovers.ChildrenOf(procs)
		kept := map[int]bool{}
		for _, pid := range append(skip, c.warmShims()...) {
			kept[pid] = true
			for _, d := range leftovers.Descendants(children, pid) {
				kept[d] = true
			}
		}
		for _, p := range leftovers.Processes(c.daemonPID(), c.home) {
			if !kept[p.PID] {
				left = append(left, p.String())
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		return fmt.Sprintf("processes left %v after their sessions were removed: %s", grace, leftovers.Brief(left, 4))
	}
	return ""
}

// warmShims are the live shims of the home's warm boundaries (session
// directories whose record is warm): the daemon's, not a session's.
func (c *chaos) warmShims() []int {
	layout := home.Layout{Root: c.home}
	entries, _ := os.ReadDir(layout.SessionsDir())
	var pids []int
	for _, e := range entries {
		dir := session.Dir(layout.SessionDir(e.Name()))
		if rec, err := dir.ReadRecord(); err != nil || !rec.Warm {
			continue
		}
		if boot, _ := dir.ReadBootstrap(); boot != nil && procstat.Alive(boot.PID, boot.StartTime) {
			pids = append(pids, boot.PID)
		}
	}
	return pids
}

// checkStateFiles parses every JSON file of the daemon's own under the
// home, and reads every session's output log whole.
func (c *chaos) checkStateFiles() error {
	layout := home.Layout{Root: c.home}
	var problems []string
	filepath.WalkDir(c.home, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(c.home, path)
		parts := strings.Split(rel, string(filepath.Separator))
		// An agent's own directories are the runtime's, not state.
		if e.IsDir() && len(parts) == 3 && parts[0] == "agents" && parts[2] != "" && parts[2] != "." {
			return fs.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".json") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", rel, err))
		} else if !json.Valid(data) {
			problems = append(problems, fmt.Sprintf("%s does not parse as JSON (%d bytes)", rel, len(data)))
		}
		return nil
	})
	entries, _ := os.ReadDir(layout.SessionsDir())
	for _, e := range entries {
		if err := readLog(session.Dir(filepath.Join(layout.SessionsDir(), e.Name())).OutputPath()); err != nil {
			problems = append(problems, fmt.Sprintf("session %s: %v", e.Name(), err))
		}
	}
	if len(problems) > 0 {
		return errors.New("state: " + leftovers.Brief(problems, 4))
	}
	return nil
}

// readLog reads an output log's records to its end: a record that does
// not read back is a violation; a torn one at the end of a live log is not.
func readLog(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	r := outputlog.NewReader(f, 0)
	for {
		if _, err := r.Next(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// checkCounters: each counter still runs, and its output is whole and grew
// since the last round.
func (c *chaos) checkCounters() error {
	for _, j := range c.counters {
		s, err := c.show(j.id)
		if err != nil {
			return err
		}
		if s.State != "running" {
			return fmt.Errorf("%s is %s (exit %d, %s), want running through every round", j, s.State, s.ExitCode, s.Reason)
		}
		n, err := c.output(j)
		if err != nil {
			return fmt.Errorf("%s: %v", j, err)
		}
		if n <= j.last {
			return fmt.Errorf("%s printed no line this round (%d lines, %d a round ago)", j, n, j.last)
		}
		j.last = n
	}
	return nil
}

// finish stops the counters and checks their whole output and exit code.
func (c *chaos) finish() string {
	for _, j := range c.counters {
		if r := c.retry("session", "stop", j.id); r.code != 0 {
			return fmt.Sprintf("session stop %s: exit %d: %s", j, r.code, strings.TrimSpace(r.stderr))
		}
		s, err := c.waitEnded(j, time.Minute)
		if err != nil {
			return err.Error()
		}
		n, err := c.output(j)
		if err != nil {
			return fmt.Sprintf("%s: %v", j, err)
		}
		if s.State != "exited" || s.ExitCode != 128+int(syscall.SIGTERM) || n < j.last {
			return fmt.Sprintf("%s after its stop: %s with exit %d and %d lines, want exited %d with at least %d", j, s.State, s.ExitCode, n, 128+int(syscall.SIGTERM), j.last)
		}
		if r := c.retry("session", "rm", j.id); r.code != 0 {
			return fmt.Sprintf("session rm %s: exit %d: %s", j, r.code, strings.TrimSpace(r.stderr))
		}
	}
	// The warm boundaries go with their agents' setting.
	for _, strategy := range c.strategies() {
		if r := c.retry("agent", "edit", agentOf[strategy], "--warm", "0"); r.code != 0 {
			return fmt.Sprintf("agent edit %s --warm 0: exit %d: %s", agentOf[strategy], r.code, strings.TrimSpace(r.stderr))
		}
	}
	if w := c.warmShims(); len(w) > 0 {
		return fmt.Sprintf("warm boundaries left after --warm 0: shims %v", w)
	}
	if left := c.leftProcesses(nil, 10*time.Second); left != "" {
		return left
	}
	// Every session is removed and every warm boundary discarded: their
	// directories, and their VMs', are gone.
	layout := home.Layout{Root: c.home}
	for _, dir := range []string{layout.SessionsDir(), layout.VMsDir()} {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			return fmt.Sprintf("%s holds %d entries after every session was removed: %s", dir, len(entries), leftovers.Brief(names, 4))
		}
	}
	// No boundary runs any more: every placeholder is gone.
	return c.agentLeftovers(false)
}
