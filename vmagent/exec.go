package vmagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// Limits on processes.
const (
	// maxProcesses bounds the process table (the exited stay, for Wait).
	maxProcesses = 1024
	// outputDrain is how long Wait waits, after the process exited, for its
	// output to reach end of file: a descendant that keeps the pipe open
	// would otherwise hold Wait forever.
	outputDrain = 5 * time.Second
	// maxArgBytes bounds the arguments and environment of one Exec (the
	// kernel's own limit is about this).
	maxArgBytes = 2 << 20
)

// defaultPath is the PATH used to find a command when the environment
// given has none (Docker's).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// process is one process the agent started, or failed to start.
type process struct {
	id  string
	pid int // 0 if it could not start
	os  *os.Process

	exited chan struct{} // closed once reaped; code and reason are set then
	done   chan struct{} // closed once exited and its output copied
	code   int32
	reason string

	stdinConn net.Conn // closed at exit, which ends the stdin copy
}

// procTable starts processes, reaps them and reports their exits.
type procTable struct {
	logf func(string, ...any)
	// reapAll: this is PID 1, every orphan in the VM is its child, and the
	// reaper waits for any child; otherwise only for those it started.
	reapAll bool
	devNull string
	drain   time.Duration // outputDrain; shorter in tests

	// mu guards the fields that follow. Exec holds it from before the fork
	// until the pid is recorded, so the reaper never misses a fast exit.
	mu    sync.Mutex
	procs map[string]*process
	live  map[int]*process
}

func newProcTable(reapAll bool, logf func(string, ...any)) *procTable {
	return &procTable{
		logf:    logf,
		reapAll: reapAll,
		devNull: os.DevNull,
		drain:   outputDrain,
		procs:   map[string]*process{},
		live:    map[int]*process{},
	}
}

// reapLoop reaps children on every SIGCHLD until ctx ends.
func (t *procTable) reapLoop(ctx context.Context) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	t.reap()
	for {
		select {
		case <-sigs:
			t.reap()
		case <-ctx.Done():
			return
		}
	}
}

func (t *procTable) reap() {
	if !t.reapAll {
		t.mu.Lock()
		defer t.mu.Unlock()
		for pid, p := range t.live {
			var ws unix.WaitStatus
			if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); got == pid && err == nil {
				t.exitedLocked(p, ws)
			}
		}
		return
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		t.mu.Lock()
		if p := t.live[pid]; p != nil {
			t.exitedLocked(p, ws)
		}
		t.mu.Unlock()
	}
}

func (t *procTable) exitedLocked(p *process, ws unix.WaitStatus) {
	delete(t.live, p.pid)
	switch {
	case ws.Signaled():
		sig := ws.Signal()
		p.code = 128 + int32(sig)
		p.reason = fmt.Sprintf("killed by signal %d", int(sig))
		if name := unix.SignalName(sig); name != "" {
			p.reason += " (" + name + ")"
		}
	default:
		p.code = int32(ws.ExitStatus())
	}
	p.os.Release()
	close(p.exited)
}

// execSpec is a validated Exec request.
type execSpec struct {
	id   string
	args []string
	env  []string
	cwd  string
	cred *syscall.Credential // nil: root
}

// checkExec validates an Exec request from the host.
func checkExec(id string, args, env []string, cwd string) (execSpec, error) {
	if err := vmtransport.CheckID(id); err != nil {
		return execSpec{}, errdefs.InvalidArgument("exec: %v", err)
	}
	if len(args) == 0 || args[0] == "" {
		return execSpec{}, errdefs.InvalidArgument("exec %s: no command", id)
	}
	size := 0
	for _, a := range args {
		if strings.IndexByte(a, 0) >= 0 {
			return execSpec{}, errdefs.InvalidArgument("exec %s: an argument contains a NUL byte", id)
		}
		size += len(a) + 1
	}
	for _, e := range env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return execSpec{}, errdefs.InvalidArgument("exec %s: environment entry %q is not KEY=VALUE", id, e)
		}
		size += len(e) + 1
	}
	if size > maxArgBytes {
		return execSpec{}, errdefs.InvalidArgument("exec %s: arguments and environment take %d bytes, more than %d", id, size, maxArgBytes)
	}
	if cwd == "" {
		cwd = "/"
	}
	if !filepath.IsAbs(cwd) || strings.IndexByte(cwd, 0) >= 0 {
		return execSpec{}, errdefs.InvalidArgument("exec %s: cwd %q is not an absolute path", id, cwd)
	}
	return execSpec{id: id, args: args, env: env, cwd: filepath.Clean(cwd)}, nil
}

// reserve claims id for a new process; the caller must then start or fail.
func (t *procTable) reserve(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.procs[id]; ok {
		return errdefs.AlreadyExists("exec %s: a process with that id exists", id)
	}
	if len(t.procs) >= maxProcesses {
		return errdefs.ResourceExhausted("exec %s: the agent keeps %d processes already", id, maxProcesses)
	}
	t.procs[id] = nil
	return nil
}

// unreserve gives id back after an Exec that failed before start.
func (t *procTable) unreserve(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[id] == nil {
		delete(t.procs, id)
	}
}

// started reports whether process id was started (or failed to): its
// streams can no longer be used. A reserved id is not started yet.
func (t *procTable) started(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.procs[id] != nil
}

// start starts spec with conns as its stdio (nil: /dev/null), after
// reserve(spec.id). A command that cannot be found or run is not an error:
// the process is recorded as exited with 127 or 126 and the reason.
func (t *procTable) start(spec execSpec, conns [3]net.Conn) *process {
	p := &process{id: spec.id, exited: make(chan struct{}), done: make(chan struct{})}
	var path string
	code, reason := checkCwd(spec.cwd)
	if code == 0 {
		path, code, reason = lookPath(spec.args[0], envPath(spec.env), spec.cwd)
	}
	if code == 0 {
		code, reason = t.fork(p, spec, path, conns)
	}
	if code != 0 {
		closeAll(conns)
		p.code, p.reason = code, reason
		close(p.exited)
		close(p.done)
		t.mu.Lock()
		t.procs[spec.id] = p
		t.mu.Unlock()
	}
	return p
}

// fork starts the process and its output copies; on failure it returns the
// exit code and reason to report.
func (t *procTable) fork(p *process, spec execSpec, path string, conns [3]net.Conn) (int32, string) {
	var files [3]*os.File
	var parentEnds [3]*os.File
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close() // the child has its copy
			}
		}
	}()
	for i, c := range conns {
		var err error
		if c == nil {
			files[i], err = os.OpenFile(t.devNull, os.O_RDWR, 0)
		} else if i == stdin {
			files[i], parentEnds[i], err = os.Pipe()
		} else {
			parentEnds[i], files[i], err = os.Pipe()
		}
		if err != nil {
			closeFiles(parentEnds)
			return 126, fmt.Sprintf("exec: %s: %v", streamKinds[i], err)
		}
	}
	attr := &os.ProcAttr{
		Dir:   spec.cwd,
		Env:   spec.env,
		Files: files[:],
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: spec.cred},
	}
	if attr.Env == nil {
		attr.Env = []string{}
	}
	t.mu.Lock()
	proc, err := os.StartProcess(path, spec.args, attr)
	if err != nil {
		t.mu.Unlock()
		closeFiles(parentEnds)
		return startFailure(spec.args[0], err)
	}
	p.os, p.pid = proc, proc.Pid
	p.stdinConn = conns[stdin]
	t.procs[spec.id] = p
	t.live[p.pid] = p
	t.mu.Unlock()

	var copies sync.WaitGroup
	if parentEnds[stdin] != nil {
		go copyStdin(parentEnds[stdin], conns[stdin])
	}
	for _, i := range []int{stdout, stderr} {
		if parentEnds[i] != nil {
			copies.Add(1)
			go func() {
				defer copies.Done()
				copyOutput(conns[i], parentEnds[i])
			}()
		}
	}
	go t.finish(p, &copies, parentEnds, conns)
	return 0, ""
}

// finish waits for the exit, then for the output (bounded), and marks the
// process done.
func (t *procTable) finish(p *process, copies *sync.WaitGroup, pipes [3]*os.File, conns [3]net.Conn) {
	<-p.exited
	if p.stdinConn != nil {
		p.stdinConn.Close()
	}
	flushed := make(chan struct{})
	go func() {
		copies.Wait()
		close(flushed)
	}()
	select {
	case <-flushed:
	case <-time.After(t.drain):
		t.logf("process %s: its output stayed open %v after it exited (a descendant holds it); cut", p.id, t.drain)
		closeFiles([3]*os.File{nil, pipes[stdout], pipes[stderr]})
		closeAll([3]net.Conn{nil, conns[stdout], conns[stderr]})
		<-flushed
	}
	close(p.done)
}

// copyStdin feeds the stdin connection to the process until the host
// closes it, then closes the process's stdin.
func copyStdin(pipe *os.File, conn net.Conn) {
	io.Copy(pipe, conn)
	pipe.Close()
}

// copyOutput sends the process's output to the connection until end of
// file. If the host goes away it keeps reading, so the process never blocks
// on a full pipe.
func copyOutput(conn net.Conn, pipe *os.File) {
	if _, err := io.Copy(conn, pipe); err != nil {
		io.Copy(io.Discard, pipe)
	}
	pipe.Close()
	conn.Close()
}

func closeFiles(files [3]*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// envPath is PATH in env, or defaultPath.
func envPath(env []string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			return v
		}
	}
	return defaultPath
}

// lookPath finds the executable for name as a shell would: a name with a
// slash is a path (relative to cwd), others are searched in pathList. It
// returns the path, or the exit code (127: not found, 126: not executable)
// and the reason.
func lookPath(name, pathList, cwd string) (string, int32, string) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := executable(p); err != nil {
			return "", exitCodeFor(err), fmt.Sprintf("exec: %q: %v", name, unwrapPathError(err))
		}
		return p, 0, ""
	}
	var denied error
	for _, dir := range filepath.SplitList(pathList) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		err := executable(p)
		if err == nil {
			return p, 0, ""
		}
		if denied == nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
			denied = err
		}
	}
	if denied != nil {
		return "", 126, fmt.Sprintf("exec: %q: %v", name, unwrapPathError(denied))
	}
	return "", 127, fmt.Sprintf("exec: %q: executable file not found in $PATH", name)
}

// executable checks that path is a file the agent (root) may execute:
// a regular file with an execute bit.
func executable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return &os.PathError{Op: "exec", Path: path, Err: unix.EISDIR}
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return &os.PathError{Op: "exec", Path: path, Err: unix.EACCES}
	}
	return nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// exitCodeFor is 127 for what does not exist, 126 for what cannot run.
func exitCodeFor(err error) int32 {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return 127
	}
	return 126
}

// checkCwd fails with 126, as a process that cannot run, unless cwd is a
// directory (the child's own chdir error would read like a missing command).
func checkCwd(cwd string) (int32, string) {
	st, err := os.Stat(cwd)
	if err == nil && !st.IsDir() {
		err = unix.ENOTDIR
	}
	if err != nil {
		return 126, fmt.Sprintf("exec: chdir %s: %v", cwd, unwrapPathError(err))
	}
	return 0, ""
}

// startFailure turns an error from starting a process into Wait's answer.
// The file was found, so a missing file here is its interpreter (#!) or a
// shared library loader: 127, as in a shell.
func startFailure(name string, err error) (int32, string) {
	return exitCodeFor(err), fmt.Sprintf("exec: %q: %v", name, unwrapPathError(err))
}

// get returns process id.
func (t *procTable) get(id string) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[id]
	if p == nil {
		return nil, errdefs.NotFound("process %s not found", id)
	}
	return p, nil
}

// wait returns the exit of process id once its output is flushed.
func (t *procTable) wait(ctx context.Context, id string) (int32, string, error) {
	p, err := t.get(id)
	if err != nil {
		return 0, "", err
	}
	select {
	case <-p.done:
		return p.code, p.reason, nil
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
}

// maxSignal is the highest signal number (SIGRTMAX on Linux).
const maxSignal = 64

// signal sends sig to process id, or with all to every process the agent
// started and their descendants (id, if given, must still name a process).
// Signal 0 checks that the target exists.
func (t *procTable) signal(id string, sig uint32, all bool) error {
	if sig > maxSignal {
		return errdefs.InvalidArgument("signal %d: not a signal number", sig)
	}
	s := unix.Signal(sig)
	if id == "" && !all {
		return errdefs.InvalidArgument("signal: no process id (set all to signal every process)")
	}
	if id != "" {
		t.mu.Lock()
		p := t.procs[id]
		t.mu.Unlock()
		if p == nil {
			return errdefs.NotFound("signal: process %s not found", id)
		}
		if !all {
			return t.signalOne(p, s)
		}
	}
	return t.signalEvery(s)
}

func (t *procTable) signalOne(p *process, s unix.Signal) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.pid == 0 {
		return errdefs.FailedPrecondition("signal: process %s never started", p.id)
	}
	select {
	case <-p.exited:
		return errdefs.FailedPrecondition("signal: process %s has exited", p.id)
	default:
	}
	// Through the pidfd: never another process that reused the pid.
	if err := p.os.Signal(s); err != nil {
		return fmt.Errorf("signal process %s (pid %d): %w", p.id, p.pid, err)
	}
	return nil
}

// signalEvery signals every process but the agent. As PID 1 that is
// kill(-1): the kernel skips init, and it reaches the descendants that left
// their process group too (daemons). Elsewhere (tests) it is the process
// group of each process the agent started that has not exited: once the
// leader is reaped, its group id may name someone else's group.
func (t *procTable) signalEvery(s unix.Signal) error {
	if t.reapAll {
		if err := unix.Kill(-1, s); err != nil && err != unix.ESRCH {
			return fmt.Errorf("signal every process: %w", err)
		}
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.live {
		unix.Kill(-p.pid, s) // ESRCH: that group is gone
	}
	return nil
}
