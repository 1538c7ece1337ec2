package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
		tree:     leftovers.ListTree(a.Dir),
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
	if paths := leftovers.NewPaths(b.tree, leftovers.ListTree(b.agentDir)); len(paths) > 0 {
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
