package shim

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/steps"
)

// Runner runs a session's runtime in one strategy's boundary: each strategy
// is a package of its own (strategy/host, strategy/srt,
// strategy/microsandbox) with a Runner, and each shim binary is built with
// the runners of its family (cmd/agentconnect-shim: host and srt;
// cmd/agentconnect-shim-vm: microsandbox). The shim owns what every strategy
// shares: the session's files, its output log, its cgroup, its exit status,
// its violations, and its ttrpc service.
type Runner interface {
	// Start prepares the boundary and starts the runtime in it, and reports
	// it with Host.Running before it returns. On error nothing it started is
	// left; an error that is the boundary's says "sandbox setup:"
	// (SandboxSetupError).
	Start(h *Host) (Run, error)
}

// Preparer is a Runner that can do a start's work ahead of the session: a
// warm boundary (session.Record.Warm) is prepared as soon as its shim
// serves, and bound to the session that claims it by Prepared.Start. Its
// Start does the same work back to back.
type Preparer interface {
	Runner
	// Prepare builds the run up to the runtime's exec from what the session
	// shares with its agent (workspace, mounts, policy, limits), nothing of
	// its own (command, env, secrets). On error nothing it started is left.
	Prepare(h *Host) (Prepared, error)
}

// Prepared is a run built up to the runtime's exec.
type Prepared interface {
	// Start binds what is the session's own (h's session, as it is now,
	// and its secrets), lets the runtime exec and reports it with
	// Host.Running. ErrStaleBoundary: the run was built before something
	// it protects changed; nothing was started, and the caller discards it.
	// On other errors nothing of the run is left.
	Start(h *Host) (Run, error)
	// Discard ends a run that will not start, leaving nothing of it.
	Discard(h *Host)
}

// LauncherPath is the PATH of what a boundary starts around the runtime
// (bwrap, QEMU, virtiofsd): the system's tools. The runtime gets its own
// environment with its command.
const LauncherPath = "/usr/sbin:/usr/bin:/sbin:/bin"

// ExtraFD is the descriptor at which a command started by StartInCgroup or
// SpawnInCgroup finds its first extra file.
const ExtraFD = 5

// ErrStaleBoundary is Prepared.Start's error for a run prepared before the
// workspace changed in a way that a start now would protect (a repository
// made since): the shim then discards it and starts afresh.
var ErrStaleBoundary = errors.New("the boundary was built before the workspace changed")

// Run is a started runtime, until its end.
type Run interface {
	// Signal sends sig to the runtime, or with all to every process of the
	// session.
	Signal(sig syscall.Signal, all bool) error
	// Wait blocks until the runtime has ended and the run's processes,
	// devices and pipes are gone (the cgroup excepted: the shim removes
	// it), and says how the run ended. It is called once.
	Wait() Exit
	// Release frees what may outlive the reported exit (srt's
	// placeholders), once the exit is in status.json.
	Release()
}

// Exit is how a run ended: session.Exited with the runtime's code, or
// session.Lost (its VM died under it) with the reason.
type Exit struct {
	State  string
	Code   int
	Reason string
}

// Host is what a runner gets of its shim: the session, and the shim's ways
// to start processes (through its reaper), keep the output, and report.
type Host struct {
	s *service
}

// Session is the session the shim runs.
func (h *Host) Session() *session.Record { return h.s.rec }

// Dir is the session's directory.
func (h *Host) Dir() session.Dir { return h.s.dir }

// Log is the shim's log, with the session's fields.
func (h *Host) Log() *logrus.Entry { return h.s.log }

// Spawn starts a child of the shim that dies with it; its exit status comes
// on the channel, from the shim's reaper (see spawn). With premount, the
// child starts in a mount namespace of its own in which premount has
// mounted (see fork); nil for none.
func (h *Host) Spawn(path string, argv []string, attr *os.ProcAttr, premount func() error) (int, <-chan syscall.WaitStatus, error) {
	pid, exited, _, err := h.s.fork(path, argv, attr, false, premount)
	return pid, exited, err
}

// Signal sends sig to a child started with Spawn, unless it has been reaped
// (its pid may be another process's then). It reports whether it was sent.
func (h *Host) Signal(pid int, sig syscall.Signal) bool { return h.s.reaper.signal(pid, sig) }

// RunHelper runs a short host command (mke2fs) to its end through the
// reaper and returns its combined output.
func (h *Host) RunHelper(name string, args ...string) ([]byte, error) {
	return h.s.runHelper(name, args...)
}

// SpawnInCgroup starts "agentconnect-shim init" in its own process group
// and the session's cgroup, as cred's account when it is not nil; it waits
// for Launcher.Exec. Every process of a run starts this way, so none runs
// outside the cgroup.
func (h *Host) SpawnInCgroup(dir string, stdio [3]*os.File, extra []*os.File, cred *syscall.Credential) (*Launcher, error) {
	return h.s.spawnInCgroup(dir, stdio, extra, cred, nil)
}

// StartInCgroup starts argv with env where SpawnInCgroup would, for a start
// that knows its command when it forks: the launcher it returns has run
// its Exec, and execErr is init's exec error if any (see startInCgroup).
// With premount, argv starts in a mount namespace of its own, in which
// premount has mounted (a boundary's protected names); nil for none.
func (h *Host) StartInCgroup(argv []string, dir string, env []string, stdio [3]*os.File, extra []*os.File, cred *syscall.Credential, premount func() error) (l *Launcher, execErr string, err error) {
	return h.s.startInCgroup(argv, dir, env, stdio, extra, cred, premount)
}

// KillCgroup kills every process in the session's cgroup, when it has one.
func (h *Host) KillCgroup() error {
	if len(h.s.cg.Dirs) == 0 {
		return nil
	}
	return h.s.cg.Kill(KillTimeout)
}

// CgroupProcs lists the processes in the session's cgroup (none without one).
func (h *Host) CgroupProcs() []int {
	if len(h.s.cg.Dirs) == 0 {
		return nil
	}
	pids, _ := h.s.cg.Procs()
	return pids
}

// CopyOutput copies one of the runtime's output streams to the output log
// until it ends, then calls wg.Done.
func (h *Host) CopyOutput(r io.Reader, stream outputlog.Stream, wg *sync.WaitGroup) {
	h.s.copyOutput(r, stream, wg)
}

// CopyConsole keeps the first part of a VM's console in path (see
// copyConsole).
func (h *Host) CopyConsole(r *os.File, path string) { h.s.copyConsole(r, path) }

// LogHelper logs what a helper process (virtiofsd) says, bounded.
func (h *Host) LogHelper(r *os.File, helper, share string) { h.s.logHelper(r, helper, share) }

// Violations opens the session's violations file, for the refusals of a
// boundary's network and what a run left for host tools.
func (h *Host) Violations() *Violations { return openViolations(h.s.dir, h.s.log) }

// Secrets are the run's secret bindings: what the boundary's proxy swaps
// toward the secrets' hosts. A runner that cannot swap them refuses a run
// that has them rather than start it without (see Start).
func (h *Host) Secrets() []*shimv1.Secret { return h.s.secrets }

// Running records that run's runtime runs, with pid and its stdin, and logs
// how long each step of the start took (fields add to the log line).
func (h *Host) Running(run Run, pid int, stdin StdinWriter, st *steps.Steps, fields logrus.Fields) {
	h.s.running(run, pid, stdin, st, fields)
}

// CloseStdin closes the runtime's stdin for good, at the end of a run.
func (h *Host) CloseStdin() { h.s.closeStdin() }
