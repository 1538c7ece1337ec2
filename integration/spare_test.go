package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/leftovers"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// spares lists the spare shims (of agentconnect-shim, which host and srt
// sessions run in) that wait as the children of pid.
func spares(pid int) []int {
	var out []int
	for _, p := range leftovers.ReadProcs() {
		if p.PPID == pid && p.Spare() && strings.HasPrefix(p.Cmdline, "agentconnect-shim spare") {
			out = append(out, p.PID)
		}
	}
	slices.Sort(out)
	return out
}

// A daemon keeps spare shims; a cold start hands its session to one, which
// then reads as that session's serve in ps, and the daemon starts the next.
// The spares are the daemon's own: they go when it is killed (their pair
// closes) and when it stops, and never take a session's processes with
// them.
func TestSpareShims(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	var before []int
	eventually(t, 10*time.Second, "two spare shims", func() bool {
		before = spares(d.pid())
		return len(before) == 2
	})
	ok(t, home, "agent", "create", "sleeper", "--strategy", "host", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	s := show(t, home, id)
	if !slices.Contains(before, s.ShimPID) {
		t.Fatalf("the session's shim is pid %d, not one of the spares %v", s.ShimPID, before)
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(s.ShimPID) + "/cmdline")
	wantTitle := "agentconnect-shim\x00serve\x00--session-dir\x00" + filepath.Join(home, "sessions", id) + "\x00--socket\x00"
	if !bytes.HasPrefix(cmdline, []byte(wantTitle)) {
		t.Errorf("the shim's command line = %q, want it to begin with %q", cmdline, wantTitle)
	}
	if log, _ := os.ReadFile(filepath.Join(home, "daemon.log")); !strings.Contains(string(log), "spare shim ") {
		t.Errorf("no start in the daemon log took a spare shim:\n%s", log)
	}
	var refilled []int
	eventually(t, 10*time.Second, "the spares refilled", func() bool {
		refilled = spares(d.pid())
		return len(refilled) == 2
	})

	// Killed, the daemon leaves its spares no one to hand them a session:
	// they exit; the session runs on in its shim.
	d.kill9()
	eventually(t, 10*time.Second, "the killed daemon's spares gone", func() bool {
		for _, pid := range refilled {
			if procstat.Alive(pid, 0) {
				return false
			}
		}
		return true
	})
	if !procstat.Alive(s.ShimPID, 0) || !procstat.Alive(s.PID, 0) {
		t.Fatalf("the session's shim (%d) or runtime (%d) went with the daemon's spares", s.ShimPID, s.PID)
	}

	// A daemon that stops discards its spares before it exits.
	d.restart()
	if after := show(t, home, id); after.State != "running" || after.ShimPID != s.ShimPID {
		t.Fatalf("the session after the restart: %+v, want it running in shim %d", after, s.ShimPID)
	}
	var last []int
	eventually(t, 10*time.Second, "the new daemon's spares", func() bool {
		last = spares(d.pid())
		return len(last) == 2
	})
	ok(t, home, "session", "rm", "--force", id)
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
	for _, pid := range last {
		if procstat.Alive(pid, 0) {
			t.Errorf("spare shim %d outlived its daemon's stop", pid)
		}
	}
}
