package reaper

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/procstat"
)

// TestRunReapsOrphans runs a shell that leaves a background child behind:
// the orphan is reparented to this process and reaped, not left a zombie.
func TestRunReapsOrphans(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 0.2 & echo $!; exit 3")
	var out strings.Builder
	cmd.Stdout = &out
	code, err := Run(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 {
		t.Errorf("exit code = %d, want 3", code)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("shell printed %q", out.String())
	}
	st, err := procstat.Read(pid)
	if err != nil {
		t.Fatalf("the orphan %d is gone already: %v", pid, err)
	}
	if st.PPID != os.Getpid() {
		t.Fatalf("the orphan's parent is %d, want this process %d (the subreaper)", st.PPID, os.Getpid())
	}
	// Run returned when the shell exited; reap the orphan the same way the
	// loop does, and check it does not linger as a zombie.
	cmd2 := exec.Command("sleep", "0.5")
	if _, err := Run(cmd2); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := procstat.Read(pid); err != nil {
			return // reaped: no /proc entry, not even a zombie
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d still has a /proc entry (a zombie nobody reaped)", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
