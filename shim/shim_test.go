package shim

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestResetOOMScore(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"-500\n", "0"}, {"0\n", "0\n"}, {"300\n", "300\n"}} {
		path := filepath.Join(t.TempDir(), "oom_score_adj")
		os.WriteFile(path, []byte(tc.in), 0o600)
		resetOOMScore(path)
		if got, _ := os.ReadFile(path); string(got) != tc.want {
			t.Errorf("oom_score_adj %q becomes %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The reaper signals a child only until it has reaped it: after that, its
// pid may already name another process.
func TestReaperSignalsOnlyUnreapedChildren(t *testing.T) {
	r := newReaper()
	r.mu.Lock()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "30"}, &os.ProcAttr{})
	if err != nil {
		r.mu.Unlock()
		t.Fatal(err)
	}
	pid := p.Pid
	exited := r.expectLocked(pid)
	r.mu.Unlock()
	p.Release()
	if !r.signal(pid, syscall.SIGKILL) {
		t.Fatal("signal of a running child reported it gone")
	}
	for {
		r.reap()
		select {
		case ws := <-exited:
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Errorf("child ended with %v, want SIGKILL", ws)
			}
			if r.signal(pid, syscall.SIGKILL) {
				t.Error("signal of a reaped child was sent")
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}
