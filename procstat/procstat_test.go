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
