package reaper

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

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
