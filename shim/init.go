package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// The files init inherits from the shim.
const (
	fdSync    = 3 // one byte arrives once init is in the session's cgroup
	fdExecErr = 4 // "CODE message" when exec fails; closed by a successful exec
)

// runInit is the runtime's first moments: it waits for the shim, then
// replaces itself with the runtime. It returns only on failure.
func runInit(args []string) error {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return errors.New("init: no command")
	}
	syncFile := os.NewFile(fdSync, "sync")
	errFile := os.NewFile(fdExecErr, "exec-error")
	var b [1]byte
	if n, _ := syncFile.Read(b[:]); n != 1 {
		os.Exit(1) // the shim went away before releasing us
	}
	syncFile.Close()
	unix.CloseOnExec(fdExecErr)

	path, err := exec.LookPath(args[0]) // PATH is the runtime's: this is its environment
	if err == nil {
		err = syscall.Exec(path, args, os.Environ())
	}
	code := 126 // found but cannot run
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
		code = 127
	}
	fmt.Fprintf(errFile, "%d %v", code, err)
	errFile.Close()
	os.Exit(code)
	return nil
}
