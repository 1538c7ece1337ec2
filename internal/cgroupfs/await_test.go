package cgroupfs

import (
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestAwaitExit: awaitExit returns by its deadline while the process runs,
// and once it returns on a longer one, the process has exited.
func TestAwaitExit(t *testing.T) {
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	fd, err := unix.PidfdOpen(p.Pid, 0)
	if err != nil {
		t.Skipf("no pidfd here: %v", err)
	}
	defer unix.Close(fd)
	awaitExit([]int{fd}, 20*time.Millisecond)
	if exited(t, fd) {
		t.Fatal("sleep 60 exited by itself")
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		p.Signal(syscall.SIGKILL)
	}()
	awaitExit([]int{fd}, time.Minute)
	if !exited(t, fd) {
		t.Error("awaitExit returned before the process exited")
	}
}

// exited reports whether the child of pidfd has exited, without reaping it.
func exited(t *testing.T, pidfd int) bool {
	t.Helper()
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	return info.Signo != 0
}
