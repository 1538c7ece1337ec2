// Package shim is agentconnect-shim: one process per session run that owns
// the runtime, its stdio and its exit status, and outlives the supervisor.
//
// Lifecycle, top to bottom:
//
//	start   (bootstrap) listen on the socket, re-exec as "serve" in a new
//	        session, wait until it is ready, print its address, exit
//	serve   write bootstrap.json, serve ttrpc; Start launches the runtime
//	        through "init"; when the runtime exits, kill what is left of the
//	        session, drain the output, write status.json, exit
//	init    wait for the shim to place it in the session's cgroup, then
//	        exec the runtime, or bwrap for srt (exec errors go back to the
//	        shim on a pipe)
//	sandbox-exec  inside an srt sandbox: hand the proxy listeners to the
//	        shim, restrict writes with Landlock, exec the runtime
//	share-exec  inside the bwrap around a microsandbox share's virtiofsd:
//	        check the share's protected binds, exec virtiofsd
//	probe, image  one-shot calls of the daemon (api/helper): can
//	        microsandbox run here; prepare a guest image
package shim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/agentconnect-md/agentconnect/internal/fds"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
	"github.com/agentconnect-md/agentconnect/strategy/srt/sandbox"
)

// Main runs the shim with the arguments after the program name.
func Main(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: agentconnect-shim start|serve --session-dir DIR --socket PATH")
	}
	switch args[0] {
	case "init":
		return runInit(args[1:])
	case "sandbox-exec":
		return sandbox.Exec(args[1:])
	case "share-exec":
		return microvm.ShareExec(args[1:])
	case "probe":
		return microsandbox.ProbeMain(os.Stdin, stdout)
	case "image":
		return microsandbox.ImageMain(os.Stdin, stdout, os.Stderr)
	}
	fs := flag.NewFlagSet("agentconnect-shim "+args[0], flag.ContinueOnError)
	dir := fs.String("session-dir", "", "the session directory")
	socket := fs.String("socket", "", "the ttrpc socket path")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *dir == "" || *socket == "" {
		return errors.New("--session-dir and --socket are required")
	}
	// What the supervisor's parent left open must not reach the runtime.
	fds.CloseOnExec()
	switch args[0] {
	case "start":
		return bootstrap(*dir, *socket, stdout)
	case "serve":
		return serve(*dir, *socket)
	}
	return fmt.Errorf("unknown command %q (want start, serve or init)", args[0])
}
