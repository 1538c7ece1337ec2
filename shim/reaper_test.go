package shim

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
)

// busyReaper runs the reaper's wait4(-1) loop without pause, as a shim
// does while the runtime's children come and go, until the test ends.
func busyReaper(t *testing.T, s *service) {
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() { close(stop); <-done })
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			s.reaper.reap()
			time.Sleep(20 * time.Microsecond)
		}
	}()
}

// TestHelpersRunThroughTheReaper: the VM's disks are formatted with mke2fs
// while the reaper reaps every child it sees. A helper run with os/exec
// lost its exit status to the reaper ("waitid: no child processes") and
// failed the start; through runHelper the reaper hands the status over.
func TestHelpersRunThroughTheReaper(t *testing.T) {
	if _, err := exec.LookPath("mke2fs"); err != nil {
		t.Skip("mke2fs (e2fsprogs) is not installed")
	}
	s := &service{reaper: newReaper()}
	busyReaper(t, s)
	for i := 0; i < 5; i++ {
		c := microvm.Config{VM: session.VM{Dir: t.TempDir(), DiskGiB: 1}}
		if _, err := microvm.PrepareDisks(c, s.runHelper); err != nil {
			t.Fatalf("disks %d: %v", i, err)
		}
	}
	// A failing helper says how it ended, with its output.
	out, err := s.runHelper("sh", "-c", "echo no such disk >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exited with status 3") || strings.TrimSpace(string(out)) != "no such disk" {
		t.Errorf("runHelper of a failing command: %q, %v", out, err)
	}
	if _, err := s.runHelper("no-such-helper-anywhere"); err == nil {
		t.Error("runHelper of a missing command succeeded")
	}
}
