package shim

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/execmsg"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/protect"
	"github.com/agentconnect-md/agentconnect/internal/steps"
)

const (
	// KillTimeout bounds killing what is left of a session after its runtime
	// exits.
	KillTimeout = 5 * time.Second
	// DrainTimeout bounds reading the output that is still in the pipes: a
	// process that escaped the session may hold them open forever.
	DrainTimeout = 2 * time.Second
)

// Pipe returns a pipe whose shim end is non-blocking (so Go's poller serves
// it, with deadlines) and whose runtime end is blocking, as programs expect
// their stdio to be.
func Pipe(shimReads bool) (shimEnd, childEnd *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	r, w := p[0], p[1]
	if !shimReads {
		r, w = w, r
	}
	if err := unix.SetNonblock(r, true); err != nil {
		unix.Close(r)
		unix.Close(w)
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return os.NewFile(uintptr(r), "shim"), os.NewFile(uintptr(w), "runtime"), nil
}

// The main goroutine keeps the main thread, from before any other goroutine
// runs: fork's goroutine returns with its thread locked once the thread has
// a mount namespace of its own (or could not leave the session's cgroup),
// which ends the thread; but Go cannot end the main thread, and wedges it
// instead, in that namespace or cgroup for the shim's life, where /proc/self
// would show it.
func init() { runtime.LockOSThread() }

// spawn starts a child of the shim that dies with it: Pdeathsig fires when
// the thread that forked dies, so that thread stays locked to a goroutine
// until the child has exited. The shim's reaper reaps it; its status comes
// on the returned channel.
func (s *service) spawn(path string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	pid, exited, _, err := s.fork(path, argv, attr, false, nil)
	return pid, exited, err
}

// fork is spawn; with inCgroup, the child is born in the session's cgroup
// where the kernel allows it: on cgroup v2 by CLONE_INTO_CGROUP, on v1 by
// forking from a thread that entered the cgroup (cgroupfs.EnterThread).
// inside reports whether it was; if not, the caller moves it. A child that
// started comes with its pid even when err is set (the thread could not
// leave the cgroup): the caller kills it. With premount, the forking thread
// gets a mount namespace of its own (protect.NewMountNS), premount mounts
// in it, and the child is born there; its error is a *PremountError.
func (s *service) fork(path string, argv []string, attr *os.ProcAttr, inCgroup bool, premount func() error) (pid int, exited <-chan syscall.WaitStatus, inside bool, err error) {
	if attr.Sys == nil {
		attr.Sys = &syscall.SysProcAttr{}
	}
	attr.Sys.Pdeathsig = syscall.SIGKILL
	type result struct {
		pid    int
		exited <-chan syscall.WaitStatus
		inside bool
		err    error
	}
	// start starts the child with the reaper held, so that its exit
	// cannot be reaped before it is expected.
	start := func(a *os.ProcAttr) (r result) {
		s.reaper.mu.Lock()
		defer s.reaper.mu.Unlock()
		p, err := os.StartProcess(path, argv, a)
		if err != nil {
			return result{err: err}
		}
		r = result{pid: p.Pid, exited: s.reaper.expectLocked(p.Pid)}
		p.Release() // the reaper waits for it, not os.Process
		return r
	}
	started := make(chan result, 1)
	exitStatus := make(chan syscall.WaitStatus, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: when this goroutine returns, its thread exits,
		// which is fine only after the child is gone (and the only way
		// out of the cgroup should the move back fail).
		//
		// The cgroup first: where the thread must enter it (v1), the
		// entry reads mountinfo, which the premount makes ~3x longer.
		var res result
		var dir *os.File
		var leave func() error
		var cgErr error // why the child will not be born in the cgroup
		if inCgroup && len(s.cg.Dirs) > 0 {
			if dir, cgErr = s.cg.OpenV2(); cgErr != nil {
				leave, cgErr = s.cg.EnterThread()
			}
		}
		if premount != nil {
			err := protect.NewMountNS()
			if err == nil {
				err = premount()
			}
			if err != nil {
				if dir != nil {
					dir.Close()
				}
				if leave != nil {
					err = errors.Join(err, leave())
				}
				started <- result{err: &PremountError{err}}
				return
			}
		}
		if dir != nil {
			sys := *attr.Sys
			sys.UseCgroupFD, sys.CgroupFD = true, int(dir.Fd())
			into := *attr
			into.Sys = &sys
			res = start(&into)
			dir.Close()
			res.inside, cgErr = res.err == nil, res.err
		}
		if cgErr != nil {
			s.log.WithError(cgErr).Debug("start the runtime outside its cgroup and move it in")
		}
		if !res.inside {
			res = start(attr)
			if leave != nil {
				// Back out at once: the session's cgroup would list the shim.
				res.err = errors.Join(res.err, leave())
				res.inside = res.pid != 0
			}
		}
		started <- res
		if res.pid != 0 {
			exitStatus <- <-res.exited
		}
	}()
	res := <-started
	return res.pid, exitStatus, res.inside, res.err
}

// PremountError is why a start's mount namespace could not be made.
type PremountError struct{ Err error }

func (e *PremountError) Error() string { return "the boundary's mounts: " + e.Err.Error() }
func (e *PremountError) Unwrap() error { return e.Err }

// helperTimeout bounds a helper command of the shim's (mke2fs).
const helperTimeout = time.Minute

// maxHelperOutput bounds what is kept of a helper's output.
const maxHelperOutput = 64 << 10

// runHelper runs a short host command of the shim's own (mke2fs) to its end
// and returns its combined output. It goes through spawn, so that the
// reaper collects its exit: os/exec's wait beside the reaper's wait4(-1)
// loses the status whenever the reaper gets there first ("waitid: no child
// processes"). Every command the serving shim starts goes through spawn.
func (s *service) runHelper(name string, args ...string) ([]byte, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	defer r.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	pid, exited, err := s.spawn(path, append([]string{name}, args...), &os.ProcAttr{Env: os.Environ(), Files: []*os.File{devnull, w, w}})
	devnull.Close()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", name, err)
	}
	// A pidfd taken while the child is not yet reaped is the child's
	// alone: a late timer cannot reach a process given its pid since.
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			defer unix.Close(fd)
			select {
			case <-done:
			case <-time.After(helperTimeout):
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
		}()
	}
	out, _ := io.ReadAll(io.LimitReader(r, maxHelperOutput))
	io.Copy(io.Discard, r) // the rest, so that it never blocks on a full pipe
	ws := <-exited
	switch {
	case ws.Signaled():
		return out, fmt.Errorf("%s was killed by signal %d (%s)", name, int(ws.Signal()), unix.SignalName(ws.Signal()))
	case ws.ExitStatus() != 0:
		return out, fmt.Errorf("%s exited with status %d", name, ws.ExitStatus())
	}
	return out, nil
}

// Launcher is "agentconnect-shim init" started in the session's cgroup and
// its own process group, waiting to be told what to exec (see runInit); or,
// from startInCgroup, a command that runs (syncW and errR nil).
type Launcher struct {
	PID    int
	Exited <-chan syscall.WaitStatus
	syncW  *os.File
	errR   *os.File
}

// spawnInCgroup starts init in its own process group with stdio and extra
// files (at ExtraFD and up) and places it in the session's cgroup; it execs
// what Exec gives it. With cred, the launcher (init, then what it execs)
// runs as that account; with premount, in a mount namespace of its own
// (see fork).
func (s *service) spawnInCgroup(dir string, stdio [3]*os.File, extra []*os.File, cred *syscall.Credential, premount func() error) (*Launcher, error) {
	syncR, syncW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		syncR.Close()
		syncW.Close()
		return nil, err
	}
	files := append([]*os.File{stdio[0], stdio[1], stdio[2], syncR, errW}, extra...)
	attr := &os.ProcAttr{Dir: dir, Env: []string{}, Files: files,
		// The session's own process group: kill(-pid) reaches its children.
		Sys: &syscall.SysProcAttr{Setpgid: true, Credential: cred}}
	pid, exited, inside, err := s.fork("/proc/self/exe", []string{"agentconnect-shim", "init"}, attr, true, premount)
	syncR.Close()
	errW.Close()
	l := &Launcher{PID: pid, Exited: exited, syncW: syncW, errR: errR}
	if err != nil && pid == 0 {
		syncW.Close()
		errR.Close()
		return nil, fmt.Errorf("start runtime: %w", err)
	}
	if err == nil && !inside {
		err = s.cg.Add(pid)
	}
	if err == nil {
		err = l.waitReady()
	}
	if err != nil {
		l.Abandon()
		return nil, fmt.Errorf("start runtime: %w", err)
	}
	return l, nil
}

// waitReady waits until init waits for its command (initReady). A
// launcher that ends first (killed, or the shim's binary cannot start)
// closes the pipe.
func (l *Launcher) waitReady() error {
	var b [1]byte
	if n, _ := l.errR.Read(b[:]); n != 1 || b[0] != initReady {
		return fmt.Errorf("init (pid %d) ended before it waited for the command", l.PID)
	}
	return nil
}

// startInCgroup starts argv with env in its own process group and the
// session's cgroup, with stdio and extra files (at fds 5 and up), as cred's
// account when it is not nil. The command is forked there at once, with no
// init between: a start that knows its command when it forks does not pay
// init's own start (~1.5 ms of a cold host start). A command not found on
// env's PATH, or whose direct start fails (it cannot run, the directory is
// missing), goes through init after all, which reports the exec error the
// way a late-bound start does. The launcher it returns has run its Exec.
// premount is fork's.
func (s *service) startInCgroup(argv []string, dir string, env []string, stdio [3]*os.File, extra []*os.File, cred *syscall.Credential, premount func() error) (*Launcher, string, error) {
	if path, err := execmsg.LookPath(argv[0], env); err == nil {
		// fds 3 and 4 closed, as init's are once it execs.
		files := append([]*os.File{stdio[0], stdio[1], stdio[2], nil, nil}, extra...)
		attr := &os.ProcAttr{Dir: dir, Env: env, Files: files,
			Sys: &syscall.SysProcAttr{Setpgid: true, Credential: cred}}
		pid, exited, inside, err := s.fork(path, argv, attr, true, premount)
		var pe *PremountError
		if errors.As(err, &pe) {
			return nil, "", err // init would fail the same way
		}
		if err == nil && !inside {
			err = s.cg.Add(pid)
		}
		if err == nil {
			return &Launcher{PID: pid, Exited: exited}, "", nil
		}
		if pid != 0 {
			syscall.Kill(pid, syscall.SIGKILL)
			<-exited
			return nil, "", fmt.Errorf("start runtime: %w", err)
		}
		s.log.WithError(err).Debug("start the runtime through init, which reports why it cannot")
	}
	l, err := s.spawnInCgroup(dir, stdio, extra, cred, premount)
	if err != nil {
		return nil, "", err
	}
	execErr, err := l.Exec(argv, env)
	if err != nil {
		return nil, "", err
	}
	return l, execErr, nil
}

// Exec tells the launcher to exec argv with env, and returns init's exec
// error if any ("" once the exec succeeded).
func (l *Launcher) Exec(argv, env []string) (string, error) {
	defer l.errR.Close()
	if err := execmsg.Send(l.syncW, execmsg.Message{Argv: argv, Env: env}); err != nil {
		syscall.Kill(l.PID, syscall.SIGKILL)
		<-l.Exited
		return "", fmt.Errorf("release runtime: %w", err)
	}
	execErr, _ := io.ReadAll(io.LimitReader(l.errR, 4096))
	return string(execErr), nil
}

// Abandon kills a launcher that was never told to exec, and waits for it.
func (l *Launcher) Abandon() {
	syscall.Kill(l.PID, syscall.SIGKILL)
	l.syncW.Close()
	l.errR.Close()
	<-l.Exited
}

// StdinWriter is the runtime's stdin: a pipe, or a connection to the guest.
type StdinWriter interface {
	io.WriteCloser
	SetWriteDeadline(time.Time) error
}

// running records that run has started, with the runtime's pid.
func (s *service) running(run Run, pid int, stdin StdinWriter, st *steps.Steps, fields logrus.Fields) {
	startTime, _ := procstat.StartTime(pid)
	now := time.Now()
	s.mu.Lock()
	s.run, s.pid, s.startedAt, s.stdin = run, pid, now, stdin
	pending := s.pending
	s.mu.Unlock()
	if err := s.untilRoom("record running status", func() error {
		return s.dir.WriteStatus(&session.Status{
			Run: s.rec.Run, State: session.Running, PID: pid, PIDStartTime: startTime, StartedAt: now,
		})
	}); err != nil {
		s.log.WithError(err).Error("record running status")
	}
	s.log.WithFields(fields).WithFields(logrus.Fields{"pid": pid, "steps": st.String()}).Info("runtime started")
	if pending != 0 {
		// A stop that came during the start: the session ends as it asked.
		s.log.WithField("signal", pending).Info("deliver the signal that came while the run started")
		if err := run.Signal(pending, true); err != nil {
			s.log.WithError(err).Warnf("send %v to the session", pending)
		}
	}
	go s.stopAtOutputLimit()
}

// SandboxSetupError marks an error building a boundary, in the words a
// session's reason uses.
func SandboxSetupError(err error) error {
	if strings.HasPrefix(err.Error(), "sandbox setup:") {
		return err
	}
	return fmt.Errorf("sandbox setup: %w", err)
}

// KillGroup signals the process group led by pid, never one of pid 0 or 1.
func KillGroup(pid int, sig syscall.Signal) {
	if pid > 1 {
		syscall.Kill(-pid, sig)
	}
}

// ExitCode turns a wait status into the session's exit code (128+N for a
// signal, as shells and docker report it) and a reason. execErr is what init
// reported when it could not exec the runtime: "CODE message".
func ExitCode(ws syscall.WaitStatus, execErr string) (int, string) {
	if execErr != "" {
		code, msg, ok := strings.Cut(execErr, " ")
		if n, err := strconv.Atoi(code); ok && err == nil {
			return n, msg
		}
		return 127, execErr
	}
	if ws.Signaled() {
		sig := ws.Signal()
		return 128 + int(sig), fmt.Sprintf("killed by signal %d (%s)", int(sig), unix.SignalName(sig))
	}
	return ws.ExitStatus(), ""
}

// EndProcesses kills what is left of a session run as the shim's processes
// (the launcher's group, the cgroup) once its runtime has exited, drains the
// output that is still in the pipes and closes its stdin.
func (h *Host) EndProcesses(launcher int, outputs []*os.File, copiers *sync.WaitGroup) {
	s := h.s
	KillGroup(launcher, syscall.SIGKILL)
	if err := h.KillCgroup(); err != nil {
		s.log.WithError(err).Warn("kill the rest of the session")
	}
	if !WaitTimeout(copiers, DrainTimeout) {
		s.log.Warn("output pipes still open after the runtime exited: a process outside the session holds them")
		for _, f := range outputs {
			f.SetReadDeadline(time.Now())
		}
		copiers.Wait()
	}
	for _, f := range outputs {
		f.Close()
	}
	s.closeStdin()
}

// closeStdin closes the runtime's stdin for good at the end of a run.
func (s *service) closeStdin() {
	s.mu.Lock()
	stdin := s.stdin
	s.stdinClosed = true
	s.mu.Unlock()
	if stdin != nil {
		stdin.Close()
	}
}

// WaitTimeout waits for wg at most d and reports whether it finished.
func WaitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// SignalProcesses signals every process of a session run as the shim's
// processes: those of its cgroup, or without one, of the runtime's process
// group (a scan of /proc, which with hundreds of sessions stopping at once
// cost each shim seconds). A graceful signal spares the pids in spare (the
// launcher and an srt sandbox's init: bwrap dies of it without passing it
// on, taking the sandbox down at once); SIGKILL reaches them too, the
// launcher last.
func (h *Host) SignalProcesses(pid, launcher int, spare []int, sig syscall.Signal) {
	targets := map[int]bool{}
	if len(h.s.cg.Dirs) > 0 {
		for _, p := range h.CgroupProcs() {
			targets[p] = true
		}
	} else if st, err := procstat.Read(pid); err == nil && st.PGID > 1 {
		for _, p := range procstat.Group(st.PGID) {
			targets[p] = true
		}
	}
	targets[pid] = true
	spared := map[int]bool{launcher: true}
	for _, p := range spare {
		spared[p] = true
	}
	for p := range targets {
		if sig == syscall.SIGKILL || p == pid || !spared[p] {
			syscall.Kill(p, sig)
		}
	}
	if sig == syscall.SIGKILL && launcher != pid {
		h.Signal(launcher, sig)
	}
}

// finish records the end of the run (status.json first, so that it
// survives the shim) and releases whoever waits for it. state is exited, or
// lost when the runtime's VM died under it.
func (s *service) finish(state string, code int, reason string) {
	s.mu.Lock()
	if s.outputLimited {
		reason = strings.TrimSuffix(s.outputLimitReason()+"; "+reason, "; ")
	}
	st := &session.Status{
		Run: s.rec.Run, State: state, PID: s.pid, ExitCode: code, Reason: reason,
		StartedAt: s.startedAt, ExitedAt: time.Now(),
	}
	s.mu.Unlock()
	if err := s.untilRoom("record exit status", func() error { return s.dir.WriteStatus(st) }); err != nil {
		s.log.WithError(err).Error("record exit status")
	}
	if len(s.cg.Dirs) > 0 {
		if err := s.cg.Remove(); err != nil {
			s.log.WithError(err).Warn("remove cgroup")
		}
	}
	s.mu.Lock()
	s.exit, s.status = st, shimv1.Status_EXITED
	s.mu.Unlock()
	s.log.WithFields(map[string]any{"exitCode": code, "reason": reason}).Info("runtime exited")
	close(s.exited)
}
