package vmagent

import (
	"os"
	"syscall"
	"testing"
	"time"
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
