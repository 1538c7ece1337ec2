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

// launch starts the runtime through "agentconnect-shim init" (directly, or
// in bwrap for srt), places it in the session's cgroup, lets it exec, and
// starts copying its output.
func (s *service) launch() (pid int, retErr error) {
	var closers []*os.File
	defer func() {
		if retErr != nil {
			for _, f := range closers {
				f.Close()
			}
		}
	}()
	stdinW, stdinR, err := pipe(false)
	if err != nil {
		return 0, err
	}
	closers = append(closers, stdinW, stdinR)
	stdoutR, stdoutW, err := pipe(true)
	if err != nil {
		return 0, err
	}
	closers = append(closers, stdoutR, stdoutW)
	stderrR, stderrW, err := pipe(true)
	if err != nil {
		return 0, err
	}
	closers = append(closers, stderrR, stderrW)
	syncR, syncW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	closers = append(closers, syncR, syncW)
	errR, errW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	closers = append(closers, errR, errW)

	// How long each step took, for the log: where a slow start goes.
	var steps []string
	mark := time.Now()
	step := func(name string) {
		steps = append(steps, fmt.Sprintf("%s %v", name, time.Since(mark).Round(10*time.Microsecond)))
		mark = time.Now()
	}
	spec := s.rec.Spec
	argv := append([]string{"agentconnect-shim", "init", "--"}, spec.Command...)
	files := []*os.File{stdinR, stdoutW, stderrW, syncR, errW}
	var srt *srtRun
	if spec.Sandbox != nil {
		if srt, err = s.prepareSRT(stderrW); err != nil {
			return 0, sandboxSetupError(err)
		}
		step("boundary")
		defer func() {
			if retErr != nil {
				srt.closeChildEnds()
				srt.stop()
				srt.boundary.Release()
			}
		}()
		if argv, err = srt.argv(); err != nil {
			return 0, err
		}
		// bwrap's own stderr is the setup pipe; the runtime's is fd 6.
		files = append([]*os.File{stdinR, stdoutW, srt.setupW, syncR, errW}, srt.childFiles...)
	}
	attr := &os.ProcAttr{
		Dir:   spec.Workspace,
		Env:   spec.Env,
		Files: files,
		Sys: &syscall.SysProcAttr{
			Setpgid: true, // the session's own process group: kill(-pid) reaches its children
			// The runtime dies with the shim. Pdeathsig fires when the
			// thread that forked dies, so that thread stays locked to the
			// goroutine below until the runtime has exited.
			Pdeathsig: syscall.SIGKILL,
		},
	}
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
	step("fork")
	launcher := res.pid
	for _, f := range []*os.File{stdinR, stdoutW, stderrW, syncR, errW} {
		f.Close()
	}
	if srt != nil {
		srt.closeChildEnds()
	}
	closers = []*os.File{stdinW, stdoutR, stderrR, syncW, errR}
	if err := s.cg.Add(launcher); err != nil {
		syscall.Kill(launcher, syscall.SIGKILL)
		<-exitStatus
		return 0, err
	}
	step("cgroup")
	// Let init exec the runtime (or bwrap); it closes errW on a successful
	// exec.
	if _, err := syncW.Write([]byte{0}); err != nil {
		syscall.Kill(launcher, syscall.SIGKILL)
		<-exitStatus
		return 0, fmt.Errorf("release runtime: %w", err)
	}
	syncW.Close()
	execErr, _ := io.ReadAll(io.LimitReader(errR, 4096))
	errR.Close()
	step("exec")

	pid = launcher
	nsInit := 0
	if srt != nil && len(execErr) == 0 {
		nsInit, pid = srt.started()
		step("sandbox")
	}
	startTime, _ := procstat.StartTime(pid)
	now := time.Now()
	s.mu.Lock()
	s.pid, s.launcher, s.sandboxInit, s.startedAt, s.stdin = pid, launcher, nsInit, now, stdinW
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
	s.log.WithFields(map[string]any{"pid": pid, "launcher": launcher, "steps": strings.Join(steps, ", ")}).Info("runtime started")

	go func() {
		ws := <-exitStatus
		code, reason := exitCode(ws, string(execErr))
		if srt != nil {
			if c, r, ok := srt.exit(code); ok {
				code, reason = c, r
			}
		}
		s.endRun(launcher, []*os.File{stdoutR, stderrR}, &copiers)
		if srt != nil {
			srt.stop()
		}
		s.finish(code, reason)
		if srt != nil {
			// Placeholders go after the exit is reported: no one waits
			// for them, and a session started meanwhile keeps them.
			srt.boundary.Release()
		}
		close(s.cleanedUp)
	}()
	return pid, nil
}

// sandboxSetupError marks an error building a boundary, in the words a
// session's reason uses.
func sandboxSetupError(err error) error {
	if strings.HasPrefix(err.Error(), "sandbox setup:") {
		return err
	}
	return fmt.Errorf("sandbox setup: %w", err)
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
