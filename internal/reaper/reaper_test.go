package reaper

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/procstat"
)

// TestRunReapsOrphans runs a shell that leaves a background child behind
// and exits at once: Run returns the shell's code only after the orphan,
// reparented to this process, has ended and been reaped (no zombie left).
func TestRunReapsOrphans(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 0.3 & echo $!; exit 3")
	var out strings.Builder
	cmd.Stdout = &out
	start := time.Now()
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
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("Run returned after %v, before the orphan ended", took)
	}
	if st, err := procstat.Read(pid); err == nil {
		t.Errorf("the orphan %d still has a /proc entry (state %c): nobody reaped it", pid, st.State)
	}
}
