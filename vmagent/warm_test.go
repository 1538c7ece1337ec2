package vmagent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWaitReaped: a settling Setup returns once the warm tools are reaped
// by someone else (PID 1's reaper; here a goroutine), and returns on its
// bound for one that never ends.
func TestWaitReaped(t *testing.T) {
	start := func(secs string) *os.Process {
		p, err := os.StartProcess("/bin/sleep", []string{"sleep", secs}, &os.ProcAttr{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	quick := start("0.2")
	go quick.Wait()
	waitReaped([]int{quick.Pid}, time.Minute)
	if err := syscall.Kill(quick.Pid, 0); err != syscall.ESRCH {
		t.Errorf("waitReaped returned while %d was there (kill 0: %v)", quick.Pid, err)
	}

	stuck := start("60")
	defer func() { stuck.Kill(); stuck.Wait() }()
	waitReaped([]int{stuck.Pid}, 50*time.Millisecond)
	if err := syscall.Kill(stuck.Pid, 0); err != nil {
		t.Errorf("the process that never ends: %v", err)
	}
}

// TestWarmToolsRunIdle: the warm tools run in the idle scheduling class,
// so that a runtime started right after a cold Setup never waits for them.
func TestWarmToolsRunIdle(t *testing.T) {
	out := filepath.Join(t.TempDir(), "policy")
	defer func(saved [][]string) { warmTools = saved }(warmTools)
	// Field 41 of /proc/PID/stat is the scheduling policy (SCHED_IDLE 5).
	warmTools = [][]string{{"/bin/sh", "-c", "cut -d' ' -f41 /proc/self/stat > " + out}}
	pids := <-startWarmTools(t.Logf)
	if len(pids) != 1 {
		t.Fatalf("started %v, want one tool", pids)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pids[0], &ws, 0, nil); err != nil || ws.ExitStatus() != 0 {
		t.Fatalf("the tool: %v, exit %d", err, ws.ExitStatus())
	}
	policy, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(policy)); got != strconv.Itoa(unix.SCHED_IDLE) {
		t.Errorf("the warm tool's scheduling policy is %s, want SCHED_IDLE (%d)", got, unix.SCHED_IDLE)
	}
}
