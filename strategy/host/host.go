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
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/steps"
	"github.com/agentconnect-md/agentconnect/shim"
)

// Runner runs the runtime as a process of the shim, in the boundary
// NewBoundary makes for each run (nil: none, the host strategy).
type Runner struct {
	NewBoundary func() Boundary
}

// Boundary wraps a run's process in a sandbox.
type Boundary interface {
	// Prepare builds the boundary for a runtime whose stderr is stderr,
	// from what the session shares with its agent (workspace, mounts,
	// policy, limits): nothing of the session's own (command, env,
	// secrets), which Bind gives it.
	Prepare(h *shim.Host, stderr *os.File) (Launch, error)
	// Started follows the boundary once the launcher runs, up to the
	// runtime's exec: it returns the runtime's pid and the pids a graceful
	// signal must spare.
	Started(h *shim.Host, launcher int) (pid int, spare []int, err error)
	// Stale reports whether the boundary, built ahead of its session (a
	// warm one), would protect less than one built now.
	Stale() (bool, error)
	// Watch follows what Stale looks at, from a warm boundary's build to
	// its claim, so that Stale can answer without looking again; on an
	// error it does look.
	Watch() error
	// Bind gives the boundary what is the session's own, from h's session
	// and secrets, and lets the runtime exec.
	Bind(h *shim.Host) error
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

// Launch is how a boundary starts: the launcher's command (started in the
// session's cgroup by StartInCgroup) and environment, its stderr (nil: the
// runtime's own), and the files it gets from fd 5 up.
type Launch struct {
	Argv   []string
	Env    []string
	Stderr *os.File
	Extra  []*os.File
	// Premount, if set, mounts in the launcher's own mount namespace
	// before it starts (see shim.Host.StartInCgroup).
	Premount func() error
	// Close is called once the launcher holds its copies of the files.
	Close func()
}

// Start prepares the run (Prepare) and starts it at once; without a
// boundary, the command is forked with no init between (StartInCgroup).
func (r Runner) Start(h *shim.Host) (shim.Run, error) {
	p, err := r.prepare(h, true)
	if err != nil {
		return nil, err
	}
	return p.start(h)
}

// Prepare does all of a start that is not the session's own: the pipes, the
// boundary, and in the session's cgroup "agentconnect-shim init" (no
// boundary) or the boundary's launcher (for srt, the sandbox up to the
// runtime's exec). Start binds the rest.
func (r Runner) Prepare(h *shim.Host) (shim.Prepared, error) {
	p, err := r.prepare(h, false)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// prepare is Prepare; with now, for a start that binds at once, a run
// without a boundary starts its command straight away (StartInCgroup).
func (r Runner) prepare(h *shim.Host, now bool) (_ *prepared, retErr error) {
	st := steps.New()
	p := &prepared{st: st}
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

	spec := h.Session().Spec
	var launch Launch
	if r.NewBoundary != nil {
		p.b = r.NewBoundary()
		if launch, err = p.b.Prepare(h, stderrW); err != nil {
			return nil, shim.SandboxSetupError(err)
		}
		st.Done("boundary")
		defer func() {
			if retErr != nil {
				launch.Close()
				p.b.Stop(h)
				p.b.Release()
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
	if u := spec.RunAs; u != nil && p.b == nil {
		cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	var l *shim.Launcher
	switch {
	case p.b != nil:
		// The boundary's launcher (bwrap) is known now: it starts at
		// once, and the runtime waits in it for the session.
		l, p.execErr, err = h.StartInCgroup(launch.Argv, spec.Workspace, launch.Env, stdio, launch.Extra, cred, launch.Premount)
	case now:
		l, p.execErr, err = h.StartInCgroup(spec.Command, spec.Workspace, spec.Env, stdio, launch.Extra, cred, nil)
		p.bound = true
	default:
		l, err = h.SpawnInCgroup(spec.Workspace, stdio, launch.Extra, cred)
	}
	for _, f := range []*os.File{stdinR, stdoutW, stderrW} {
		f.Close()
	}
	if launch.Close != nil {
		launch.Close()
	}
	closers = []*os.File{stdinW, stdoutR, stderrR}
	var premountErr *shim.PremountError
	if errors.As(err, &premountErr) {
		// A protected name swapped since Prepare: the boundary's own
		// refusal, as Verify's inside would be.
		return nil, shim.SandboxSetupError(premountErr.Err)
	}
	if err != nil {
		return nil, err
	}
	p.launcher, p.stdin, p.outputs = l, stdinW, []*os.File{stdoutR, stderrR}
	p.pid = l.PID
	st.Done("exec")
	if p.b == nil {
		return p, nil
	}
	if p.execErr == "" {
		if p.pid, p.spare, err = p.b.Started(h, l.PID); err != nil {
			p.kill(h)
			return nil, shim.SandboxSetupError(p.b.Failed(<-l.Exited, err))
		}
		st.Done("sandbox")
		if !now {
			// Built: from here on a claim's Stale reads what changed.
			if err := p.b.Watch(); err != nil {
				h.Log().WithError(err).Info("the boundary's roots are not watched: a claim scans them")
			}
		}
	}
	return p, nil
}

// prepared is a run up to the runtime's exec.
type prepared struct {
	b        Boundary // nil: none
	launcher *shim.Launcher
	pid      int    // the runtime's, once it runs
	spare    []int  // what a graceful signal spares besides the launcher (the sandbox's init)
	execErr  string // init's, when it could not exec the boundary's launcher (or, bound, the command)
	bound    bool   // the launcher was started with the command (no boundary, a cold start)
	stdin    *os.File
	outputs  []*os.File
	st       *steps.Steps
}

// kill ends a launcher that is not reaped yet (its pid, and group, are
// still ours) and what it started in the cgroup.
func (p *prepared) kill(h *shim.Host) {
	shim.KillGroup(p.launcher.PID, syscall.SIGKILL)
	if err := h.KillCgroup(); err != nil {
		h.Log().WithError(err).Warn("kill the sandbox that did not start")
	}
}

// Start is start for a run prepared ahead of its session (a warm boundary
// the session claimed): its log says how long it waited.
func (p *prepared) Start(h *shim.Host) (shim.Run, error) {
	p.st.Waited()
	if p.b != nil && p.execErr == "" {
		if stale, err := p.b.Stale(); err != nil {
			p.Discard(h)
			return nil, shim.SandboxSetupError(fmt.Errorf("check the protected names: %w", err))
		} else if stale {
			return nil, shim.ErrStaleBoundary // the caller discards it
		}
	}
	return p.start(h)
}

// start binds what is the session's own and lets the runtime exec: the
// command and env (through init, or the boundary's Bind), then copies its
// output.
func (p *prepared) start(h *shim.Host) (shim.Run, error) {
	spec := h.Session().Spec
	if p.b == nil && !p.bound {
		execErr, err := p.launcher.Exec(spec.Command, spec.Env)
		if err != nil {
			p.closeFiles()
			return nil, err
		}
		p.execErr = execErr
	} else if p.b != nil && p.execErr == "" {
		if err := p.b.Bind(h); err != nil {
			p.Discard(h)
			return nil, shim.SandboxSetupError(err)
		}
	}
	p.st.Done("bind")
	proc := &process{h: h, b: p.b, pid: p.pid, launcher: p.launcher.PID, exited: p.launcher.Exited,
		execErr: p.execErr, spare: p.spare, outputs: p.outputs}
	proc.copiers.Add(2)
	go h.CopyOutput(p.outputs[0], outputlog.Stdout, &proc.copiers)
	go h.CopyOutput(p.outputs[1], outputlog.Stderr, &proc.copiers)
	h.Running(proc, proc.pid, p.stdin, p.st, logrus.Fields{"launcher": p.launcher.PID})
	return proc, nil
}

// Discard ends a run that was prepared and will not start: its launcher,
// its boundary, its pipes.
func (p *prepared) Discard(h *shim.Host) {
	if p.b == nil {
		p.launcher.Abandon()
	} else {
		p.kill(h)
		<-p.launcher.Exited
		p.b.Stop(h)
		p.b.Release()
	}
	p.closeFiles()
}

func (p *prepared) closeFiles() {
	p.stdin.Close()
	for _, f := range p.outputs {
		f.Close()
	}
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
