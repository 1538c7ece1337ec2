package cgroupfs_test

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestKill: Kill empties a cgroup whose processes fork while they are
// killed, and the ones that are not the caller's children (a shell's
// grandchildren) go too.
func TestKill(t *testing.T) {
	cg, _ := sessionCgroup(t, "agentconnect-test-kill-", 256)
	// A shell that keeps forking sleeps in the background, bounded.
	cmd := exec.Command("/bin/sh", "-c", `sleep 60 & sleep 60 & i=0; while [ $i -lt 2000 ]; do sleep 60 & i=$((i+1)); done; wait`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if err := cg.Add(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	// Let it fork a few inside.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if pids, _ := cg.Procs(); len(pids) >= 4 || time.Now().After(deadline) {
			break
		}
	}
	if err := cg.Kill(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if pids, err := cg.Procs(); err != nil || len(pids) != 0 {
		t.Fatalf("after Kill the cgroup lists %v (%v)", pids, err)
	}
	err := <-done
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the shell ended with %v, want SIGKILL", err)
	}
}
