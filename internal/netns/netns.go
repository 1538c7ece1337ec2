// Package netns runs code in another network namespace, on a thread of its
// own that enters the namespace and comes back.
package netns

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn on a locked thread in the network namespace of fd (an open
// /proc/PID/ns/net), and returns its error, or the one entering the
// namespace. A socket fn makes belongs to that namespace for its whole
// life. A thread that cannot come back is never handed back to the Go
// runtime: it ends with its goroutine.
func Do(fd int, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer back.Close()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		err = fn()
		if unix.Setns(int(back.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}
