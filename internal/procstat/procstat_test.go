package procstat

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	line := "1234 (we(ird) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 100 18446744073709551615\n"
	st, err := parse(1234, []byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{PID: 1234, State: 'S', PPID: 1, PGID: 1234, StartTime: 98765}
	if st != want {
		t.Errorf("parse = %+v, want %+v", st, want)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2"} {
		if _, err := parse(1, []byte(bad)); err == nil {
			t.Errorf("parse(%q) succeeded, want an error", bad)
		}
	}
}

func TestSelfAlive(t *testing.T) {
	st, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !Alive(os.Getpid(), st.StartTime) {
		t.Error("this process is not alive")
	}
	if Alive(os.Getpid(), st.StartTime+1) {
		t.Error("a different start time counts as alive (pid reuse undetected)")
	}
}

func TestZombieIsDead(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	// Wait for the child to become a zombie without reaping it.
	var info syscall.WaitStatus
	deadline := time.Now().Add(10 * time.Second)
	for Alive(pid, 0) {
		if time.Now().After(deadline) {
			t.Fatal("child never exited")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st, err := Read(pid)
	if err != nil {
		t.Fatalf("zombie has no stat: %v", err)
	}
	if st.State != 'Z' {
		t.Errorf("state = %c, want Z", st.State)
	}
	syscall.Wait4(pid, &info, 0, nil)
	if Alive(pid, 0) {
		t.Error("reaped child is alive")
	}
}

func TestGroup(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 5 & sleep 5")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	deadline := time.Now().Add(5 * time.Second)
	for len(Group(cmd.Process.Pid)) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("Group = %v, want the shell and its two sleeps", Group(cmd.Process.Pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if g := Group(os.Getpid()); len(g) == 0 {
		// This process leads no group of its own under go test; nothing to check.
		t.Logf("test process group: %v", g)
	}
}

// startGroup starts a shell leading its own process group with a child
// sleep in it, and waits until both run.
func startGroup(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for len(Group(cmd.Process.Pid)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("Group = %v, want the shell and its sleep", Group(cmd.Process.Pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cmd
}

// TestSignalChecksStartTime: a pid whose start time is not the recorded one
// is never signalled, its group neither; with the right start time, the
// whole group is.
func TestSignalChecksStartTime(t *testing.T) {
	cmd := startGroup(t)
	pid := cmd.Process.Pid
	start, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func() error{
		"Signal":      func() error { return Signal(pid, start+1, syscall.SIGKILL) },
		"SignalGroup": func() error { return SignalGroup(pid, start+1, syscall.SIGKILL) },
		"no start":    func() error { return SignalGroup(pid, 0, syscall.SIGKILL) },
	} {
		if err := f(); err != ErrNotSame {
			t.Errorf("%s with another start time: %v, want ErrNotSame", name, err)
		}
	}
	if err := Kill(pid, start+1, time.Second); err != nil {
		t.Errorf("Kill with another start time: %v, want nil (the recorded process is not running)", err)
	}
	time.Sleep(50 * time.Millisecond)
	if n := len(Group(pid)); n < 2 {
		t.Fatalf("the group lost processes to a signal with the wrong start time: %d left", n)
	}
	if err := SignalGroup(pid, start, syscall.SIGKILL); err != nil {
		t.Fatalf("SignalGroup with the right start time: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(Group(pid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("group %d still has %v after SignalGroup", pid, Group(pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := Signal(pid, start, syscall.SIGKILL); err == nil {
		t.Error("Signal of a dead process succeeded")
	}
}

// TestKillWaits: Kill returns once the process is dead.
func TestKillWaits(t *testing.T) {
	cmd := startGroup(t)
	pid := cmd.Process.Pid
	start, _ := StartTime(pid)
	if err := Kill(pid, start, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if Alive(pid, start) {
		t.Error("alive after Kill returned")
	}
}
