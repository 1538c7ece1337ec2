package shim

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/outputlog"
	"github.com/agentconnect-md/agentconnect/procstat"
	"github.com/agentconnect-md/agentconnect/session"
)

const (
	// killTimeout bounds killing what is left of a session after its runtime
	// exits.
	killTimeout = 5 * time.Second
	// drainTimeout bounds reading the output that is still in the pipes: a
	// process that escaped the session may hold them open forever.
	drainTimeout = 2 * time.Second
)

// pipe returns a pipe whose shim end is non-blocking (so Go's poller serves
// it, with deadlines) and whose runtime end is blocking, as programs expect
// their stdio to be.
func pipe(shimReads bool) (shimEnd, childEnd *os.File, err error) {
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

// launch starts the runtime through "agentconnect-shim init", places it in
// the session's cgroup, lets it exec, and starts copying its output.
func (s *service) launch() (pid int, retErr error) {
	var closers []*os.File
	closeAll := func() {
		for _, f := range closers {
			f.Close()
		}
	}
	defer func() {
		if retErr != nil {
			closeAll()
		}
	}()
	stdinW, stdinR, err := pipe(false)
	if err != nil {
		return 0, err
	}
	stdoutR, stdoutW, err := pipe(true)
	if err != nil {
		stdinW.Close()
		stdinR.Close()
		return 0, err
	}
	stderrR, stderrW, err := pipe(true)
	if err != nil {
		return 0, err
	}
	syncR, syncW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	closers = append(closers, stdinW, stdinR, stdoutR, stdoutW, stderrR, stderrW, syncR, syncW, errR, errW)

	spec := s.rec.Spec
	attr := &os.ProcAttr{
		Dir:   spec.Workspace,
		Env:   spec.Env,
		Files: []*os.File{stdinR, stdoutW, stderrW, syncR, errW},
		Sys: &syscall.SysProcAttr{
			Setpgid: true, // the session's own process group: kill(-pid) reaches its children
			// The runtime dies with the shim. Pdeathsig fires when the
			// thread that forked dies, so that thread stays locked to the
			// goroutine below until the runtime has exited.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	argv := append([]string{"agentconnect-shim", "init", "--"}, spec.Command...)
	type result struct {
		pid    int
		err    error
		exited <-chan syscall.WaitStatus
	}
	started := make(chan result, 1)
	exitStatus := make(chan syscall.WaitStatus, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: when this goroutine returns, its thread exits,
		// which is fine only after the runtime is gone.
		s.reaper.mu.Lock()
		p, err := os.StartProcess("/proc/self/exe", argv, attr)
		if err != nil {
			s.reaper.mu.Unlock()
			started <- result{err: err}
			return
		}
		pid := p.Pid
		exited := s.reaper.expectLocked(pid)
		p.Release() // the reaper waits for it, not os.Process
		s.reaper.mu.Unlock()
		started <- result{pid: pid, exited: exited}
		exitStatus <- <-exited
	}()
	res := <-started
	if res.err != nil {
		return 0, fmt.Errorf("start runtime: %w", res.err)
	}
	pid = res.pid
	for _, f := range []*os.File{stdinR, stdoutW, stderrW, syncR, errW} {
		f.Close()
	}
	closers = []*os.File{stdinW, stdoutR, stderrR, syncW, errR}
	if err := s.cg.Add(pid); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		<-exitStatus
		return 0, err
	}
	// Let init exec the runtime; it closes errW on a successful exec.
	if _, err := syncW.Write([]byte{0}); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		<-exitStatus
		return 0, fmt.Errorf("release runtime: %w", err)
	}
	syncW.Close()
	execErr, _ := io.ReadAll(io.LimitReader(errR, 4096))
	errR.Close()

	startTime, _ := procstat.StartTime(pid)
	now := time.Now()
	s.mu.Lock()
	s.pid, s.startedAt, s.stdin = pid, now, stdinW
	s.mu.Unlock()

	var copiers sync.WaitGroup
	copiers.Add(2)
	go s.copyOutput(stdoutR, outputlog.Stdout, &copiers)
	go s.copyOutput(stderrR, outputlog.Stderr, &copiers)

	if err := s.dir.WriteStatus(&session.Status{
		Run: s.rec.Run, State: session.Running, PID: pid, PIDStartTime: startTime, ExitCode: 0, StartedAt: now,
	}); err != nil {
		s.log.WithError(err).Error("record running status")
	}
	s.log.WithField("pid", pid).Info("runtime started")

	go func() {
		ws := <-exitStatus
		code, reason := exitCode(ws, string(execErr))
		s.endRun(pid, []*os.File{stdoutR, stderrR}, &copiers)
		s.finish(code, reason)
	}()
	return pid, nil
}

// killGroup signals the process group led by pid, never one of pid 0 or 1.
func killGroup(pid int, sig syscall.Signal) {
	if pid > 1 {
		syscall.Kill(-pid, sig)
	}
}

// exitCode turns a wait status into the session's exit code (128+N for a
// signal, as shells and docker report it) and a reason. execErr is what init
// reported when it could not exec the runtime: "CODE message".
func exitCode(ws syscall.WaitStatus, execErr string) (int, string) {
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

func (s *service) copyOutput(f *os.File, stream outputlog.Stream, wg *sync.WaitGroup) {
	defer wg.Done()
	br := bufio.NewReaderSize(f, 32<<10)
	buf := make([]byte, 32<<10)
	for {
		n, err := br.Read(buf)
		if n > 0 {
			if werr := s.out.Write(stream, buf[:n]); werr != nil {
				s.log.WithError(werr).Error("write output log")
			}
		}
		if err != nil {
			return
		}
	}
}

// endRun kills what is left of the session once its runtime has exited and
// drains the output that is still in the pipes.
func (s *service) endRun(pid int, outputs []*os.File, copiers *sync.WaitGroup) {
	killGroup(pid, syscall.SIGKILL)
	if len(s.cg.Dirs) > 0 {
		if err := s.cg.Kill(killTimeout); err != nil {
			s.log.WithError(err).Warn("kill the rest of the session")
		}
	}
	drained := make(chan struct{})
	go func() { copiers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		s.log.Warn("output pipes still open after the runtime exited: a process outside the session holds them")
		for _, f := range outputs {
			f.SetReadDeadline(time.Now())
		}
		<-drained
	}
	for _, f := range outputs {
		f.Close()
	}
	s.mu.Lock()
	stdin := s.stdin
	s.stdinClosed = true
	s.mu.Unlock()
	if stdin != nil {
		stdin.Close()
	}
}

// finish records the exit (status.json first, so that it survives the shim)
// and releases whoever waits for it.
func (s *service) finish(code int, reason string) {
	s.mu.Lock()
	st := &session.Status{
		Run: s.rec.Run, State: session.Exited, PID: s.pid, ExitCode: code, Reason: reason,
		StartedAt: s.startedAt, ExitedAt: time.Now(),
	}
	s.mu.Unlock()
	if err := s.dir.WriteStatus(st); err != nil {
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
