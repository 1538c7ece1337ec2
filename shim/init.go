package shim

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/execmsg"
)

// The files init inherits from the shim.
const (
	fdSync    = 3 // the command to exec (execmsg), sent once init is in the session's cgroup
	fdExecErr = 4 // initReady once init waits, then "CODE message" when exec fails; closed by a successful exec
)

// initReady is the byte init writes on fdExecErr once it waits for its
// command: the Go runtime's start (~4 ms here) is behind it, so a warm
// host boundary is ready only then, and a claim's exec does not wait for it.
const initReady = 'R'

// runInit is the runtime's first moments: it waits in the session's cgroup
// until the shim says what to exec (at once for a cold start; when a
// session claims it, for a warm host boundary), then becomes it. It returns
// only on failure.
func runInit(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("init: takes no arguments (the command comes on fd %d), got %q", fdSync, args)
	}
	syncFile := os.NewFile(fdSync, "sync")
	errFile := os.NewFile(fdExecErr, "exec-error")
	if _, err := errFile.Write([]byte{initReady}); err != nil {
		os.Exit(1) // the shim went away before init was up
	}
	m, err := execmsg.Receive(syncFile)
	syncFile.Close()
	if errors.Is(err, execmsg.ErrNone) {
		os.Exit(1) // the shim went away, or gave the launcher up, before releasing us
	}
	if err != nil {
		fmt.Fprintf(errFile, "%d %v", 126, err)
		os.Exit(126)
	}
	unix.CloseOnExec(fdExecErr)
	code, err := execmsg.Exec(m)
	fmt.Fprintf(errFile, "%d %v", code, err)
	errFile.Close()
	os.Exit(code)
	return nil
}
