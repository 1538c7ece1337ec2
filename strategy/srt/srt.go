// Package srt is the srt strategy's runner: the host runner's process in a
// bubblewrap sandbox (package sandbox) under a seccomp filter (seccomp) and
// Landlock, whose only network is the policy proxy (proxy) the shim serves
// on listeners sandbox-exec hands out of the sandbox.
package srt

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/execmsg"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
	"github.com/agentconnect-md/agentconnect/internal/protect"
	"github.com/agentconnect-md/agentconnect/shim"
	"github.com/agentconnect-md/agentconnect/strategy/host"
	"github.com/agentconnect-md/agentconnect/strategy/srt/proxy"
	"github.com/agentconnect-md/agentconnect/strategy/srt/sandbox"
	"github.com/agentconnect-md/agentconnect/strategy/srt/seccomp"
)

// sandboxReadyTimeout bounds waiting for bwrap to report the sandbox's pid.
const sandboxReadyTimeout = 20 * time.Second

// Runner runs srt sessions: the host runner, in a sandbox per run.
func Runner() host.Runner {
	return host.Runner{NewBoundary: func() host.Boundary { return &srtRun{} }}
}

// srtRun is the shim's side of one srt sandbox: the files bwrap and
// sandbox-exec get, and what they report back.
type srtRun struct {
	boundary *sandbox.Boundary
	// childFiles go to the launcher at fds 5, 6, ... (see package sandbox).
	childFiles []*os.File
	setupW     *os.File // bwrap's stderr
	setupR     *os.File
	statusR    *os.File
	listenersR *os.File
	execErrR   *os.File
	execW      *os.File // the runtime's command, for sandbox-exec (FDExec)
	proxy      *proxy.Server
	violations *shim.Violations
	inject     *shim.Injector // for a run with secrets

	mu        sync.Mutex // guards the fields below
	listeners []net.Listener
	netns     *os.File // the sandbox's network namespace, for forwards
	setupErr  strings.Builder
	ready     bool // sandbox-exec ran: bwrap built the sandbox
}

// Prepare builds the boundary and the pipes for a run; stderr is the
// runtime's stderr (fd 6 in the sandbox).
func (r *srtRun) Prepare(h *shim.Host, stderr *os.File) (_ host.Launch, retErr error) {
	spec := h.Session().Spec
	sb := spec.Sandbox
	var opened []*os.File
	defer func() {
		if retErr != nil {
			for _, f := range opened {
				f.Close()
			}
			if r.boundary != nil {
				r.boundary.Close()
				r.boundary.Release()
			}
		}
	}()
	pair := func() (*os.File, *os.File, error) {
		rd, wr, err := os.Pipe()
		if err == nil {
			opened = append(opened, rd, wr)
		}
		return rd, wr, err
	}
	var statusW, execErrW, execR, seccompR, seccompW *os.File
	var err error
	if r.setupR, r.setupW, err = pair(); err != nil {
		return host.Launch{}, err
	}
	if r.statusR, statusW, err = pair(); err != nil {
		return host.Launch{}, err
	}
	if r.execErrR, execErrW, err = pair(); err != nil {
		return host.Launch{}, err
	}
	if seccompR, seccompW, err = pair(); err != nil {
		return host.Launch{}, err
	}
	if execR, r.execW, err = pair(); err != nil {
		return host.Launch{}, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return host.Launch{}, fmt.Errorf("socketpair: %w", err)
	}
	r.listenersR = os.NewFile(uintptr(fds[0]), "listeners")
	listenersW := os.NewFile(uintptr(fds[1]), "listeners-sandbox")
	opened = append(opened, r.listenersR, listenersW)

	// The seccomp program, for bwrap to read and apply (fail closed: a
	// program that does not load stops bwrap, and the run).
	prog, err := seccomp.Program(seccomp.Options{NestedSandbox: sb.NestedSandbox})
	if err != nil {
		return host.Launch{}, fmt.Errorf("seccomp: %w", err)
	}
	buf := make([]byte, 0, 8*len(prog))
	for _, ins := range prog {
		buf = binary.LittleEndian.AppendUint16(buf, ins.Code)
		buf = append(buf, ins.Jt, ins.Jf)
		buf = binary.LittleEndian.AppendUint32(buf, ins.K)
	}
	if _, err := seccompW.Write(buf); err != nil {
		return host.Launch{}, fmt.Errorf("seccomp: %w", err)
	}
	seccompW.Close()

	policy, err := netpolicy.New(sb.AllowedDomains, sb.DeniedDomains)
	if err != nil {
		return host.Launch{}, fmt.Errorf("network policy: %w", err)
	}
	exe, err := os.OpenFile("/proc/self/exe", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return host.Launch{}, err
	}
	defer exe.Close()
	// The sandbox's trust store: the system's, and the session CA's once
	// a run with secrets binds the sandbox (Bind appends it).
	caFile, err := caBundle(string(h.Dir()))
	if err != nil {
		return host.Launch{}, fmt.Errorf("the sandbox's trust store: %w", err)
	}
	defer caFile.Close() // the boundary holds its own copy
	mounts := make([]sandbox.Mount, len(sb.Mounts))
	for i, m := range sb.Mounts {
		mounts[i] = sandbox.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly}
	}
	r.boundary, err = sandbox.Build(sandbox.Config{
		DaemonHome: sb.DaemonHome, Hidden: sb.Hidden, AgentDir: sb.AgentDir,
		Workspace: spec.Workspace, SharedWorkspace: sb.SharedWorkspace,
		Home: spec.Home, Memory: spec.Memory, Tmp: spec.Tmp, Mounts: mounts,
		NestedSandbox: sb.NestedSandbox, Credentials: sb.Credentials,
		Ledger: protect.LedgerPath(sb.DaemonHome), CABundle: caFile,
		SocketCache: filepath.Join(sb.DaemonHome, "run", "host-sockets.json"),
	}, exe, true, protect.CanPremount())
	if err != nil {
		return host.Launch{}, err
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return host.Launch{}, fmt.Errorf("bwrap is not installed: %w", err)
	}
	r.violations = h.Violations()
	r.proxy = &proxy.Server{
		Policy:      policy,
		Resolver:    netpolicy.Resolver(sb.Resolver),
		OnViolation: r.violations.Add,
		Logf:        h.Log().Debugf,
	}
	r.childFiles = append([]*os.File{statusW, stderr, listenersW, execErrW, seccompR, r.boundary.Checks, execR}, r.boundary.Files...)
	// bwrap's own stderr is the setup pipe; the runtime's is fd 6. The
	// runtime's environment comes with its command (Bind).
	return host.Launch{
		Argv:     append([]string{bwrap}, r.boundary.Args...),
		Env:      []string{"PATH=" + shim.LauncherPath},
		Stderr:   r.setupW,
		Extra:    r.childFiles,
		Premount: r.boundary.Premount,
		Close:    r.closeChildEnds,
	}, nil
}

// closeChildEnds closes the shim's copies of what the sandbox got.
func (r *srtRun) closeChildEnds() {
	r.setupW.Close()
	for _, f := range r.childFiles {
		f.Close()
	}
}

// Started follows the sandbox once bwrap runs: it collects bwrap's own
// messages and waits for sandbox-exec to hand over the proxy listeners,
// which it then serves. sandbox-exec running is the sign that bwrap built
// the sandbox (bwrap reports its pid before it sets up the mounts). It
// returns the runtime's pid, and the sandbox's init (bwrap's reaper) to
// spare from a graceful signal: like bwrap itself it dies of one without
// passing it on, taking the sandbox down at once. It fails with
// errSandboxEnded when the sandbox ended before it came up (its exit says
// why, see Failed), and with a timeout error when it did not come up within
// sandboxReadyTimeout: the caller then kills what was started.
func (r *srtRun) Started(_ *shim.Host, _ int) (runtimePID int, spare []int, err error) {
	nsInit, runtimePID, err := r.started()
	if err != nil {
		return 0, nil, err
	}
	return runtimePID, []int{nsInit}, nil
}

func (r *srtRun) started() (nsInit, runtimePID int, err error) {
	go func() {
		sc := bufio.NewScanner(io.LimitReader(r.setupR, 64<<10))
		for sc.Scan() {
			r.mu.Lock()
			if r.setupErr.Len() < 4096 {
				r.setupErr.WriteString(strings.TrimSpace(sc.Text()) + "\n")
			}
			r.mu.Unlock()
		}
	}()
	pid := make(chan int, 1)
	go func() {
		dec := json.NewDecoder(r.statusR)
		for {
			var st struct {
				ChildPID int `json:"child-pid"`
			}
			if err := dec.Decode(&st); err != nil {
				pid <- 0
				return
			}
			if st.ChildPID > 0 {
				pid <- st.ChildPID
				io.Copy(io.Discard, r.statusR)
				return
			}
		}
	}()
	handed := make(chan bool, 1)
	go func() { handed <- r.receiveListeners() }()
	timeout := time.NewTimer(sandboxReadyTimeout)
	defer timeout.Stop()
	select {
	case ok := <-handed:
		if !ok {
			return 0, 0, errSandboxEnded
		}
	case <-timeout.C:
		// receiveListeners returns once the sandbox is killed.
		return 0, 0, fmt.Errorf("the sandbox did not start within %v (bwrap: %s)", sandboxReadyTimeout, r.setupMessages())
	}
	r.mu.Lock()
	r.ready = true
	r.mu.Unlock()
	select {
	case nsInit = <-pid:
	case <-timeout.C:
		return 0, 0, fmt.Errorf("bwrap did not report the sandbox's pid within %v", sandboxReadyTimeout)
	}
	if nsInit == 0 {
		return 0, 0, errSandboxEnded
	}
	// Held from now on: a forward's connections are made in it, however
	// the pids inside come and go.
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", nsInit))
	if err != nil {
		return 0, 0, fmt.Errorf("the sandbox's network namespace: %w", err)
	}
	r.mu.Lock()
	r.netns = ns
	r.mu.Unlock()
	return nsInit, runtimeOf(nsInit), nil
}

// errSandboxEnded: the sandbox ended before it came up.
var errSandboxEnded = errors.New("the sandbox ended before it started")

// setupMessages is what bwrap has said so far, on one line.
func (r *srtRun) setupMessages() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if msg := strings.TrimSpace(r.setupErr.String()); msg != "" {
		return strings.ReplaceAll(msg, "\n", "; ")
	}
	return "nothing"
}

// runtimeOf finds the runtime: the one child of the sandbox's pid 1 (bwrap's
// reaper), which execs sandbox-exec and then the runtime, keeping its pid.
func runtimeOf(nsInit int) int {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", nsInit, nsInit))
		if err != nil {
			return nsInit
		}
		if f := strings.Fields(string(data)); len(f) > 0 {
			if pid, err := strconv.Atoi(f[0]); err == nil {
				return pid
			}
		}
		time.Sleep(time.Millisecond)
	}
	return nsInit
}

// receiveListeners takes the listening sockets sandbox-exec made inside
// the sandbox, for Bind to serve the policy proxy on. It reports false when
// the sandbox ended before handing them over.
func (r *srtRun) receiveListeners() bool {
	buf := make([]byte, 1024)
	oob := make([]byte, unix.CmsgSpace(4*8))
	n, oobn, _, _, err := unix.Recvmsg(int(r.listenersR.Fd()), buf, oob, 0)
	r.listenersR.Close()
	if err != nil || n == 0 {
		return false
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) == 0 {
		return false
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		return false
	}
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "proxy-listener")
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			continue
		}
		r.mu.Lock()
		r.listeners = append(r.listeners, l)
		r.mu.Unlock()
	}
	return true
}

// Stale reports whether a repository appeared in the sandbox's roots since
// it was built: a start now would protect it.
func (r *srtRun) Stale() (bool, error) { return r.boundary.Stale() }

// Watch follows the sandbox's roots while it waits for a claim, so that
// Stale need not scan them again.
func (r *srtRun) Watch() error { return r.boundary.Watch() }

// Bind gives the sandbox the session's own: its secrets (agentconnect-inject,
// whose session CA the trust store gains), the proxy on the listeners, and
// the runtime's command and environment, which sandbox-exec then execs.
func (r *srtRun) Bind(h *shim.Host) error {
	spec := h.Session().Spec
	// Its only network is the proxy: the proxy variables point at it.
	env := session.MergeEnv(spec.Env, sandbox.ProxyEnv())
	if len(h.Secrets()) > 0 {
		// Their tunnels go to agentconnect-inject, whose session CA the
		// sandbox trusts.
		in, caPEM, err := h.StartInjector(spec.Sandbox.TrustedCAPEM)
		if err != nil {
			return err
		}
		r.inject = in
		if err := addCA(string(h.Dir()), caPEM); err != nil {
			return fmt.Errorf("the sandbox's trust store: %w", err)
		}
		r.proxy.Interceptor = in
		env = session.MergeEnv(env, session.CAEnv())
	}
	r.mu.Lock()
	for _, l := range r.listeners {
		go r.proxy.Serve(l)
	}
	r.mu.Unlock()
	if err := execmsg.Send(r.execW, execmsg.Message{Argv: spec.Command, Env: env}); err != nil {
		return fmt.Errorf("give the sandbox its command: %w", err)
	}
	return nil
}

// Exit interprets the launcher's exit: what sandbox-exec reported, a
// sandbox bwrap could not set up, or the runtime's own exit.
func (r *srtRun) Exit(code int) (int, string, bool) {
	msg, _ := io.ReadAll(io.LimitReader(r.execErrR, 4096))
	r.execErrR.Close()
	if len(msg) > 0 {
		c, text, _ := strings.Cut(string(msg), " ")
		if n, err := strconv.Atoi(c); err == nil {
			return n, text, true
		}
	}
	r.mu.Lock()
	ready := r.ready
	setup := strings.TrimSpace(r.setupErr.String())
	r.mu.Unlock()
	if !ready {
		if setup == "" {
			setup = fmt.Sprintf("bwrap exited with status %d before the sandbox started", code)
		}
		return -1, "sandbox setup: " + strings.ReplaceAll(setup, "\n", "; "), true
	}
	return 0, "", false
}

// Stop closes the proxy listeners and what is left open, and records what
// the run left for host tools in repositories it created.
func (r *srtRun) Stop(h *shim.Host) {
	if r.inject != nil {
		r.inject.Stop()
	}
	r.execW.Close()
	r.mu.Lock()
	for _, l := range r.listeners {
		l.Close()
	}
	if r.netns != nil {
		r.netns.Close()
		r.netns = nil
	}
	r.mu.Unlock()
	r.setupR.Close()
	r.statusR.Close()
	if r.violations != nil {
		// The sandbox is gone: what it left in repositories it created
		// is final.
		for _, f := range r.boundary.Audit() {
			r.violations.AddFile(f.Path, f.Reason)
		}
		r.violations.Close()
	}
}

// Failed is the error of a start whose sandbox did not come up: in bwrap's
// or sandbox-exec's words when the sandbox ended by itself.
func (r *srtRun) Failed(ws syscall.WaitStatus, err error) error {
	if errors.Is(err, errSandboxEnded) {
		code, _ := shim.ExitCode(ws, "")
		if _, reason, ok := r.Exit(code); ok {
			return errors.New(strings.TrimPrefix(reason, "sandbox setup: "))
		}
	}
	return err
}

// Release removes the placeholders when no other boundary needs them.
func (r *srtRun) Release() {
	if r.boundary != nil {
		r.boundary.Release()
	}
}
