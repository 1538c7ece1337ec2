package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// After any failed start (a boundary that cannot be set up, a start that
// times out, QEMU exiting early) nothing of the session is left: no
// process, mount, socket, cgroup or placeholder. These tests check it as
// the bench does, with internal/leftovers.

// beforeStart is what was there before a start: the processes of ours and
// the agent's directory.
type beforeStart struct {
	procs    leftovers.Baseline
	agentDir string
	tree     map[string]string
}

// recordBeforeStart records the processes of ours and agent's directory.
func recordBeforeStart(t *testing.T, h string, d *daemon, agentName string) beforeStart {
	t.Helper()
	var a struct {
		Dir string `json:"dir"`
	}
	okJSON(t, h, &a, "agent", "show", agentName)
	if a.Dir == "" {
		t.Fatalf("agent show %s: no directory", agentName)
	}
	return beforeStart{
		procs:    leftovers.NewBaseline(leftovers.Processes(d.pid(), h)),
		agentDir: a.Dir,
		tree:     leftovers.AgentTree(a.Dir),
	}
}

// leftBehind lists what session id left since b: new processes of ours,
// its cgroup, shim socket and VM socket directory, mounts under the home,
// new paths in the agent's directory.
func (b beforeStart) leftBehind(h string, d *daemon, id string) []string {
	var left []string
	if procs := b.procs.Since(leftovers.Processes(d.pid(), h)); len(procs) > 0 {
		var names []string
		for _, p := range procs {
			names = append(names, p.String())
		}
		left = append(left, fmt.Sprintf("%d process(es) of ours: %s", len(procs), leftovers.Brief(names, 6)))
	}
	left = append(left, leftovers.Run(h, id)...)
	if mounts := leftovers.MountsUnder(h); len(mounts) > 0 {
		left = append(left, fmt.Sprintf("%d mount(s) under the home: %s", len(mounts), leftovers.Brief(mounts, 2)))
	}
	if paths := leftovers.NewPaths(b.tree, leftovers.AgentTree(b.agentDir)); len(paths) > 0 {
		left = append(left, fmt.Sprintf("%d new path(s) in the agent directory: %s", len(paths), leftovers.Brief(paths, 8)))
	}
	return left
}

// requireNothingLeft fails the test with what session id left, once the
// start has returned: the failure is reported only after the cleanup.
func (b beforeStart) requireNothingLeft(t *testing.T, h string, d *daemon, id string) {
	t.Helper()
	if left := b.leftBehind(h, d, id); len(left) > 0 {
		t.Errorf("the failed start of session %s left:\n  %s\nshim log:\n%s", id, strings.Join(left, "\n  "), shimLog(h, id))
	}
}

// failedStart starts a session of agentName, which must fail to start, and
// returns it.
func failedStart(t *testing.T, h, agentName string) session {
	t.Helper()
	r := run(t, h, "", "session", "start", agentName)
	if r.code != 0 {
		t.Fatalf("session start %s: exit %d: %s", agentName, r.code, r.stderr)
	}
	s := show(t, h, strings.TrimSpace(r.stdout))
	if s.State != "exited" || s.ExitCode != -1 || s.Reason == "" {
		t.Fatalf("session %s: %+v; want a start that failed, exited -1 with the reason", s.ID, s)
	}
	return s
}

// TestVMStartTimeoutLeavesNothing: a start whose call to the shim times
// out while the VM is still booting (the deadline made short here; TCG
// takes seconds to boot) ends the shim, QEMU, virtiofsd, their sockets and
// cgroup, and the session says why. The shim used to go on booting, with
// the session's files removed under it.
func TestVMStartTimeoutLeavesNothing(t *testing.T) {
	requireMicrosandbox(t)
	h := newHome(t)
	if err := os.WriteFile(filepath.Join(h, "config.json"), []byte(vmConfig("")), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, h, "--start-timeout", "1s")
	ok(t, h, "agent", "create", "box", "--strategy", "microsandbox", "--", "true")
	before := recordBeforeStart(t, h, d, "box")
	s := failedStart(t, h, "box")
	if !strings.Contains(s.Reason, "did not finish within 1s") {
		t.Errorf("reason %q does not say the start timed out", s.Reason)
	}
	before.requireNothingLeft(t, h, d, s.ID)
	// A QEMU that outlived its shim would go on writing the console log.
	time.Sleep(time.Second)
	before.requireNothingLeft(t, h, d, s.ID)
}

// TestVMQEMUExitLeavesNothing: QEMU exits at once (a VM of 1 TiB: more
// than the host's physical address bits allow), and the start fails with
// QEMU's words and leaves nothing of the session.
func TestVMQEMUExitLeavesNothing(t *testing.T) {
	requireMicrosandbox(t)
	h, d := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "huge", "--strategy", "microsandbox", "--memory-mib", "1048576", "--", "true")
	before := recordBeforeStart(t, h, d, "huge")
	s := failedStart(t, h, "huge")
	if !strings.Contains(s.Reason, "qemu") {
		t.Errorf("reason %q does not quote QEMU", s.Reason)
	}
	before.requireNothingLeft(t, h, d, s.ID)
}

// TestSRTBrokenBoundaryLeavesNothing: an extra mount whose source is gone
// since the agent was saved fails the sandbox's setup, and the start leaves
// nothing: no process, no cgroup, no socket, no placeholder in the agent's
// directories.
func TestSRTBrokenBoundaryLeavesNothing(t *testing.T) {
	requireBwrap(t)
	h := newHome(t)
	d := startDaemon(t, h)
	src := t.TempDir()
	ok(t, h, "agent", "create", "broken", "--strategy", "srt", "--mount", src+":/mnt/data:rw", "--", "true")
	before := recordBeforeStart(t, h, d, "broken")
	os.RemoveAll(src)
	s := failedStart(t, h, "broken")
	if !strings.HasPrefix(s.Reason, "sandbox setup:") || !strings.Contains(s.Reason, src) {
		t.Errorf("reason %q: want a sandbox setup error naming %s", s.Reason, src)
	}
	before.requireNothingLeft(t, h, d, s.ID)
}

// stopSandboxes stops (SIGSTOP) every process of the sessions in the
// cgroups under roots once it runs bwrap or what bwrap starts (not before:
// a launcher stopped before its exec would hold the shim's exec-error pipe
// open), until done is closed. It is how a sandbox that never comes up is
// made for real.
func stopSandboxes(roots []string, done <-chan struct{}) {
	stopped := map[int]bool{}
	for {
		select {
		case <-done:
			return
		default:
		}
		for _, root := range roots {
			procs, _ := filepath.Glob(filepath.Join(root, "*", "cgroup.procs"))
			for _, f := range procs {
				data, _ := os.ReadFile(f)
				for _, field := range strings.Fields(string(data)) {
					var pid int
					fmt.Sscanf(field, "%d", &pid)
					if pid == 0 || stopped[pid] {
						continue
					}
					cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
					// Not init, nor the shim: its forking thread passes
					// through the cgroup as it forks init (EnterThread).
					if err != nil || strings.HasPrefix(string(cmdline), "agentconnect-shim\x00init\x00") ||
						strings.HasPrefix(string(cmdline), "agentconnect-shim\x00serve\x00") {
						continue
					}
					syscall.Kill(pid, syscall.SIGSTOP)
					stopped[pid] = true
				}
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// TestSRTReadinessTimeoutLeavesNothing: a sandbox that does not come up
// (its processes stopped as soon as bwrap runs) fails the start as a
// sandbox setup error once the shim's readiness wait is over, and nothing
// of it is left. The shim used to record the run as running with pid 0, a
// run that could not be stopped.
func TestSRTReadinessTimeoutLeavesNothing(t *testing.T) {
	requireRoot(t) // the session cgroups are where the test finds the sandbox
	requireBwrap(t)
	h := newHome(t)
	d := startDaemon(t, h)
	ok(t, h, "agent", "create", "slow", "--strategy", "srt", "--", "true")
	probeID := strings.TrimSpace(ok(t, h, "session", "start", "slow"))
	roots := leftovers.CgroupRoots(show(t, h, probeID).Cgroup)
	if len(roots) == 0 {
		t.Skip("sessions have no cgroup here")
	}
	waitSession(t, h, probeID)
	ok(t, h, "session", "rm", probeID)
	before := recordBeforeStart(t, h, d, "slow")
	// A sandbox can come up before the test sees it: try again, a few
	// times at most.
	for attempt := 1; attempt <= 3; attempt++ {
		done := make(chan struct{})
		go stopSandboxes(roots, done)
		r := run(t, h, "", "session", "start", "slow")
		close(done)
		if r.code != 0 {
			t.Fatalf("session start: exit %d: %s", r.code, r.stderr)
		}
		s := show(t, h, strings.TrimSpace(r.stdout))
		if s.State == "running" && s.PID > 0 {
			t.Logf("attempt %d: the sandbox came up before it was stopped", attempt)
			for _, cg := range leftovers.SessionCgroups(roots, map[string]bool{s.ID: true}) {
				data, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
				for _, f := range strings.Fields(string(data)) {
					var pid int
					fmt.Sscanf(f, "%d", &pid)
					syscall.Kill(pid, syscall.SIGCONT)
				}
			}
			ok(t, h, "session", "rm", "--force", s.ID)
			continue
		}
		if s.State != "exited" || s.ExitCode != -1 || !strings.Contains(s.Reason, "sandbox setup: the sandbox did not start within") {
			t.Fatalf("session %s: %+v; want a start that failed as a sandbox setup error saying the sandbox did not start in time", s.ID, s)
		}
		before.requireNothingLeft(t, h, d, s.ID)
		return
	}
	t.Skip("the sandbox came up before the test could stop it, three times")
}
