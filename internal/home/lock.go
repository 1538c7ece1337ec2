package home

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrLocked is returned when another daemon holds the home.
type ErrLocked struct {
	Home string
	PID  int // 0 when unknown
}

func (e *ErrLocked) Error() string {
	who := "another daemon"
	if e.PID > 0 {
		who = fmt.Sprintf("another daemon (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s is already running on %s: stop it first (agentconnect --home %s stop) or use another --home", who, e.Home, e.Home)
}

// Lock takes the home's daemon lock, so that one daemon serves a home. The
// lock is an flock on an open file: it goes with the process, even on SIGKILL,
// and survives an exec that keeps the file open.
func (l Layout) Lock() (*os.File, error) {
	f, err := os.OpenFile(l.LockPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock home: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, &ErrLocked{Home: l.Root, PID: l.LockHolder()}
		}
		return nil, fmt.Errorf("lock home: %w", err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// LockHolder returns the pid the lock file names, or 0.
func (l Layout) LockHolder() int {
	data, err := os.ReadFile(l.LockPath())
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}
