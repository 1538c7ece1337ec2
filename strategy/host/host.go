// Package host is the host strategy's runner: the runtime runs as a process
// of the shim, as the daemon's user (or the account the supervisor names),
// with the environment, HOME and TMPDIR the supervisor gave it, in the
// session's process group and cgroup, its stdio on pipes the shim copies to
// the output log. A Boundary (srt) wraps that process in a sandbox; without
// one there is none.
package host

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/shim"
)

// Runner runs the runtime as a process of the shim, in the boundary
// NewBoundary makes for each run (nil: none, the host strategy).
type Runner struct {
	NewBoundary func() Boundary
}

// Boundary wraps a run's process in a sandbox.
type Boundary interface {
	// Prepare builds the boundary for a runtime whose stderr is stderr.
	Prepare(h *shim.Host, stderr *os.File) (Launch, error)
	// Started follows the boundary once the launcher runs: it returns the
	// runtime's pid and the pids a graceful signal must spare.
	Started(h *shim.Host, launcher int) (pid int, spare []int, err error)
	// Failed makes the start's error once a boundary that did not come up
	// is killed and reaped.
	Failed(ws syscall.WaitStatus, err error) error
	// Exit interprets the launcher's exit, when the boundary has more to
	// say than the wait status (ok).
	Exit(code int) (c int, reason string, ok bool)
	// Stop ends the boundary's side once the run's processes are gone.
	Stop(h *shim.Host)
	// Release frees what outlives the reported exit.
	Release()
}

// Launch is how a boundary starts the runtime: the launcher's command (run
// through init) and environment, its stderr (nil: the runtime's own), and
// the files it gets from fd 5 up.
type Launch struct {
	Argv   []string
	Env    []string
	Stderr *os.File
	Extra  []*os.File
	// Close is called once the launcher holds its copies of the files.
	Close func()
}

// Start starts the runtime through "agentconnect-shim init" (directly, or
// as the boundary says), places it in the session's cgroup, lets it exec,
// and starts copying its output.
func (r Runner) Start(h *shim.Host) (_ shim.Run, retErr error) {
	var closers []*os.File
	defer func() {
		if retErr != nil {
			for _, f := range closers {
				f.Close()
			}
		}
	}()
	stdinW, stdinR, err := shim.Pipe(false)
	if err != nil {
		return nil, err
	}
	closers = append(closers, stdinW, stdinR)
	stdoutR, stdoutW, err := shim.Pipe(true)
	if err != nil {
		return nil, err
	}
	closers = append(closers, stdoutR, stdoutW)
	stderrR, stderrW, err := shim.Pipe(true)
	if err != nil {
		return nil, err
	}
	closers = append(closers, stderrR, stderrW)

	// How long each step took, for the log: where a slow start goes.
	st := shim.NewSteps()
	spec := h.Session().Spec
	launch := Launch{Argv: append([]string{"agentconnect-shim", "init", "--"}, spec.Command...), Env: spec.Env}
	var b Boundary
	if r.NewBoundary != nil {
		b = r.NewBoundary()
		if launch, err = b.Prepare(h, stderrW); err != nil {
			return nil, shim.SandboxSetupError(err)
		}
		st.Done("boundary")
		defer func() {
			if retErr != nil {
				launch.Close()
				b.Stop(h)
				b.Release()
			}
		}()
	}
	stdio := [3]*os.File{stdinR, stdoutW, stderrW}
	if launch.Stderr != nil {
		stdio[2] = launch.Stderr
	}
	// The account the supervisor named (sandbox.host.user); a boundary
	// makes its own.
	var cred *syscall.Credential
	if u := spec.RunAs; u != nil && b == nil {
		cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	launcher, exited, execErr, err := h.StartInCgroup(launch.Argv, spec.Workspace, launch.Env, stdio, launch.Extra, cred)
	for _, f := range []*os.File{stdinR, stdoutW, stderrW} {
		f.Close()
	}
	if launch.Close != nil {
		launch.Close()
	}
	closers = []*os.File{stdinW, stdoutR, stderrR}
	if err != nil {
		return nil, err
	}
	st.Done("exec")

	p := &process{h: h, b: b, pid: launcher, launcher: launcher, exited: exited, execErr: execErr,
		outputs: []*os.File{stdoutR, stderrR}}
	if b != nil && execErr == "" {
		if p.pid, p.spare, err = b.Started(h, launcher); err != nil {
			// The launcher is not reaped yet, so its pid (and group) is
			// still ours.
			shim.KillGroup(launcher, syscall.SIGKILL)
			if kerr := h.KillCgroup(); kerr != nil {
				h.Log().WithError(kerr).Warn("kill the sandbox that did not start")
			}
			return nil, shim.SandboxSetupError(b.Failed(<-exited, err))
		}
		st.Done("sandbox")
	}
	p.copiers.Add(2)
	go h.CopyOutput(stdoutR, outputlog.Stdout, &p.copiers)
	go h.CopyOutput(stderrR, outputlog.Stderr, &p.copiers)
	h.Running(p, p.pid, stdinW, st, logrus.Fields{"launcher": launcher})
	return p, nil
}

// process is a run of the runtime as the shim's process tree.
type process struct {
	h        *shim.Host
	b        Boundary // nil: none
	pid      int      // the runtime's
	launcher int      // what the shim started and reaps: the runtime itself, or the boundary's (bwrap)
	spare    []int    // what a graceful signal spares besides the launcher (the sandbox's init)
	exited   <-chan syscall.WaitStatus
	execErr  string // init's, when it could not exec
	outputs  []*os.File
	copiers  sync.WaitGroup
}

// DialInside connects into the boundary's network (srt's); the host
// strategy has none of its own (the shim refuses its forwards).
func (p *process) DialInside(ctx context.Context, port int) (net.Conn, error) {
	d, ok := p.b.(shim.Dialer)
	if !ok {
		return nil, errors.New("no network of its own: the session runs in the host's")
	}
	return d.DialInside(ctx, port)
}

func (p *process) Signal(sig syscall.Signal, all bool) error {
	if all {
		p.h.SignalProcesses(p.pid, p.launcher, p.spare, sig)
		return nil
	}
	return syscall.Kill(p.pid, sig)
}

func (p *process) Wait() shim.Exit {
	code, reason := shim.ExitCode(<-p.exited, p.execErr)
	if p.b != nil {
		if c, r, ok := p.b.Exit(code); ok {
			code, reason = c, r
		}
	}
	p.h.EndProcesses(p.launcher, p.outputs, &p.copiers)
	if p.b != nil {
		p.b.Stop(p.h)
	}
	return shim.Exit{State: session.Exited, Code: code, Reason: reason}
}

func (p *process) Release() {
	if p.b != nil {
		p.b.Release()
	}
}
