// Command agentconnect is the agentconnect daemon (run) and its client: it
// manages agents and their sessions through the daemon's admin socket.
package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/rpcstatus"
)

func main() {
	// The daemon and `secret set` hold secrets' values: no core dump of
	// ours may write them out, and no other process of this user may
	// ptrace us or read our memory (/proc/PID/mem and environ become root's).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	root := newRootCommand()
	err := root.Execute()
	if err == nil {
		return
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(os.Stderr, "agentconnect:", message(ee.err))
		}
		os.Exit(ee.code)
	}
	fmt.Fprintln(os.Stderr, "agentconnect:", message(err))
	os.Exit(1)
}

// exitError ends the program with a given code; err, when set, is printed.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// message is the readable text of an error: a status from the daemon loses
// its "rpc error: code = ..." prefix.
func message(err error) string {
	return rpcstatus.FromStatus(err).Error()
}
