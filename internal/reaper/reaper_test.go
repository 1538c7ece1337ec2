package reaper

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// TestRunReapsOrphans runs a shell that leaves a background child behind
// and exits at once: Run returns the shell's code only after the orphan,
// reparented to this process, has ended and been reaped (no zombie left).
func TestRunReapsOrphans(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 0.3 & echo $!; exit 3")
	// A file, not a buffer: Run reaps the shell itself, so os/exec's copying
	// goroutine would never be waited for.
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout = out
	code, err := Run(cmd)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 {
		t.Errorf("exit code = %d, want 3", code)
	}
	printed, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(printed)))
	if err != nil {
		t.Fatalf("shell printed %q", printed)
	}
	if st, err := procstat.Read(pid); err == nil {
		t.Errorf("the orphan %d still has a /proc entry (state %c): nobody reaped it", pid, st.State)
	}
}

// What a harness leaves running when it exits is killed and reaped
// (Reexec's run); a plain Run leaves it alone (a daemon run under the
// subreaper command leaves sessions that outlive it, by design).
func TestRunKillsWhatAHarnessLeft(t *testing.T) {
	defer func(d time.Duration) { drainFor = d }(drainFor)
	drainFor = 300 * time.Millisecond
	for _, killLeft := range []bool{false, true} {
		cmd := exec.Command("sh", "-c", "sleep 600 & echo $!; exit 0")
		out, err := os.CreateTemp(t.TempDir(), "out")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout = out
		if _, err := run(cmd, killLeft); err != nil {
			t.Fatal(err)
		}
		printed, _ := os.ReadFile(out.Name())
		out.Close()
		pid, err := strconv.Atoi(strings.TrimSpace(string(printed)))
		if err != nil {
			t.Fatalf("shell printed %q", printed)
		}
		st, err := procstat.Read(pid)
		alive := err == nil && !st.Dead()
		if alive == killLeft {
			t.Errorf("killLeft %v: the orphan %d alive after run: %v", killLeft, pid, alive)
		}
		if alive {
			syscall.Kill(pid, syscall.SIGKILL)
			var ws syscall.WaitStatus
			syscall.Wait4(pid, &ws, 0, nil)
		}
	}
}
