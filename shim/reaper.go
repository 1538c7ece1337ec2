package shim

import (
	"os"
	"sync"
	"syscall"
)

// reaper reaps every child of the shim (it is a subreaper, so the runtime's
// orphans are its children too) and hands the runtime's exit status to
// whoever waits for it. Go's own Wait cannot be used beside a wait4(-1) loop:
// the loop would steal its status.
type reaper struct {
	mu      sync.Mutex // held while a process is started, so its exit cannot be reaped before it is expected
	waiters map[int]chan syscall.WaitStatus
}

func newReaper() *reaper {
	return &reaper{waiters: map[int]chan syscall.WaitStatus{}}
}

// expectLocked registers pid; the caller holds mu.
func (r *reaper) expectLocked(pid int) <-chan syscall.WaitStatus {
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	return ch
}

// signal sends sig to pid, a child started through spawn, unless it has been
// reaped: until it is, its pid cannot name another process. It reports
// whether the child was still there.
func (r *reaper) signal(pid int, sig syscall.Signal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiters[pid]; !ok || pid <= 1 {
		return false
	}
	syscall.Kill(pid, sig)
	return true
}

func (r *reaper) run(sigchld <-chan os.Signal) {
	for range sigchld {
		r.reap()
	}
}

func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			ch <- ws
			delete(r.waiters, pid)
		}
	}
}
