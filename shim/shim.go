// Package shim is the shim of a session run: one process per run that owns
// the runtime, its stdio and its exit status, and outlives the supervisor.
// Each strategy runs the runtime through its Runner (see runner.go); a shim
// binary is this package with the runners of a strategy family
// (cmd/agentconnect-shim: host and srt; cmd/agentconnect-shim-vm:
// microsandbox).
//
// Lifecycle, top to bottom:
//
//	serve   started by the supervisor (shimv1.Launch) in a session of its
//	        own with its socket's listener; write bootstrap.json, report
//	        ready, serve ttrpc; Start runs the strategy's
//	        runner; when the runtime exits, the runner ends what is left of
//	        the run, the shim writes status.json, removes the cgroup, exits
//	spare   started before its session (shimv1.StartSpare): wait to be
//	        handed serve's arguments and files, then go on as that serve
//	init    wait in the session's cgroup until the shim says what to exec,
//	        then exec it: a warm host run's runtime (exec errors go back
//	        to the shim on a pipe); a command known when the shim forks (a
//	        cold host run, srt's bwrap, QEMU's bwrap) needs no init
//
// and the binary's own commands (Config.Commands), such as sandbox-exec
// (srt) or share-exec, probe and image (microsandbox).
package shim

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strings"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/fds"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// Config is what a shim binary is made of.
type Config struct {
	// Name is the binary's, for messages.
	Name string
	// Runners are the strategies it runs.
	Runners map[strategy.Name]Runner
	// Commands are its other commands, by name: steps inside a boundary
	// (sandbox-exec) and one-shot calls of the daemon (probe).
	Commands map[string]func(args []string) error
}

// Main runs the shim with the arguments after the program name.
func Main(args []string, cfg Config) error {
	usage := fmt.Sprintf("usage: %s serve --session-dir DIR --socket PATH (the supervisor starts it)", cfg.Name)
	if len(args) == 0 {
		return errors.New(usage)
	}
	if args[0] == "init" {
		return runInit(args[1:])
	}
	var proc *process
	if args[0] == "spare" {
		// Started before its session (shimv1.StartSpare): it sets up its
		// process, then goes on as the serve it is handed, or ends with
		// nothing handed. A spare whose setup fails exits; the start
		// that would have had it launches a shim of its own, which says
		// why in the session's shim.log.
		var err error
		if proc, err = setupProcess(); err != nil {
			return err
		}
		serveArgs, err := awaitLaunch(proc)
		if err != nil || serveArgs == nil {
			return err
		}
		args = serveArgs
		setTitle(append([]string{cfg.Name}, args...))
	}
	if cmd, ok := cfg.Commands[args[0]]; ok {
		return cmd(args[1:])
	}
	fs := flag.NewFlagSet(cfg.Name+" "+args[0], flag.ContinueOnError)
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
	if args[0] == "serve" {
		return serve(*dir, *socket, cfg.Runners, proc)
	}
	names := []string{"serve", "init"}
	for n := range cfg.Commands {
		names = append(names, n)
	}
	sort.Strings(names[2:])
	return fmt.Errorf("unknown command %q (want %s)", args[0], strings.Join(names, ", "))
}

// awaitLaunch waits for a spare's session (shimv1.AwaitLaunch); a SIGTERM
// meanwhile ends the spare as it would a shim without a run.
func awaitLaunch(p *process) ([]string, error) {
	type launch struct {
		args []string
		err  error
	}
	got := make(chan launch, 1)
	go func() {
		args, err := shimv1.AwaitLaunch()
		got <- launch{args, err}
	}()
	select {
	case l := <-got:
		return l.args, l.err
	case <-p.sigterm:
		return nil, nil
	}
}
