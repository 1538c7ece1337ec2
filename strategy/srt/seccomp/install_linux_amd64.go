package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and loads the filter for o on every thread of the
// calling process (seccomp(2) with SECCOMP_FILTER_FLAG_TSYNC). It cannot be
// undone. On any error the caller must not exec the runtime.
func Install(o Options) error {
	prog, err := Program(o)
	if err != nil {
		return err
	}
	// no_new_privs is set per thread; TSYNC copies it to the other threads only
	// from the thread that loads the filter, so both calls must run on one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp filter: set no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	tid, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp filter: load: %w", errno)
	}
	if tid != 0 {
		// TSYNC returns the id of a thread whose filters had diverged.
		return fmt.Errorf("seccomp filter: load: thread %d could not be synchronized", tid)
	}
	return nil
}
