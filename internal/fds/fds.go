// Package fds keeps the file descriptors a process inherited from reaching
// the processes it starts.
package fds

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// CloseOnExec marks every fd from 3 up close-on-exec. Go marks the fds it
// opens itself, but not those a process inherits: without this, whatever
// the daemon's parent left open (a terminal's, a CI runner's, a service
// manager's) would pass through every shim into every runtime, boundaries
// included. Fds handed on deliberately are passed as a child's files, which
// os/exec sets up afresh.
func CloseOnExec() {
	if unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	// Before Linux 5.11: one by one.
	entries, _ := os.ReadDir("/proc/self/fd")
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}
