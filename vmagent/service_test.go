package vmagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/rpcstatus"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// These tests run the agent in this process (not as PID 1: it reaps only
// what it starts) with real processes on the host, and talk to it as the
// shim does: the serial transport's client over a socketpair standing for
// the virtio-serial port, a ttrpc connection and stdio streams.

type testAgent struct {
	api       vmagentv1.VMAgentService
	sc        *vmtransport.SerialClient
	svc       *service
	powerOffs atomic.Int32
}

// testLogf is t.Logf until the test ends, then nothing (the agent's
// goroutines outlive it briefly).
func testLogf(t *testing.T) func(string, ...any) {
	var mu sync.Mutex
	done := false
	t.Cleanup(func() { mu.Lock(); done = true; mu.Unlock() })
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			t.Logf(format, args...)
		}
	}
}

func startTestAgent(t *testing.T) *testAgent {
	t.Helper()
	logf := testLogf(t)
	ta := &testAgent{}
	procs := newProcTable(false, logf)
	procs.drain = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go procs.reapLoop(ctx)
	ta.svc = &service{
		logf:    logf,
		procs:   procs,
		streams: newPendingStreams(logf),
		paths:   guestPaths,
		setup: func(setupPaths, setupPlan, func(string, ...any)) error {
			return errors.New("a real Setup needs a VM")
		},
		modules:     closedChan(),
		powerOff:    func() error { ta.powerOffs.Add(1); return nil },
		waitStreams: 300 * time.Millisecond,
	}
	a, err := newAgent(ta.svc)
	if err != nil {
		t.Fatal(err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guest := os.NewFile(uintptr(fds[1]), "guest")
	hostFile := os.NewFile(uintptr(fds[0]), "host")
	host, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	go a.serve(ctx, vmtransport.ListenSerialConn(guest, vmtransport.WithLogf(logf)))

	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	ta.sc, err = vmtransport.NewSerialClientConn(hctx, host, vmtransport.WithLogf(logf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ta.sc.Close() })
	conn := ta.open(t, vmtransport.KindTTRPC, "")
	client := ttrpc.NewClient(conn)
	t.Cleanup(func() { client.Close() })
	ta.api = vmagentv1.NewVMAgentClient(client)
	return ta
}

func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// open opens a connection to the agent with a preface.
func (ta *testAgent) open(t *testing.T, kind, id string) net.Conn {
	t.Helper()
	conn, err := ta.sc.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if kind != "" {
		if err := vmtransport.WritePreface(conn, kind, id); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// proc is a process started through the API, with its streams.
type proc struct {
	id       string
	stdin    net.Conn
	out, err *bytes.Buffer
	copied   sync.WaitGroup
}

type execOpts struct {
	stdin bool
	env   []string
	cwd   string
}

func (ta *testAgent) exec(t *testing.T, id string, o execOpts, args ...string) (*proc, error) {
	t.Helper()
	p := &proc{id: id, out: new(bytes.Buffer), err: new(bytes.Buffer)}
	if o.stdin {
		p.stdin = ta.open(t, vmtransport.KindStdin, id)
	}
	for kind, buf := range map[string]*bytes.Buffer{vmtransport.KindStdout: p.out, vmtransport.KindStderr: p.err} {
		c := ta.open(t, kind, id)
		p.copied.Add(1)
		go func() {
			defer p.copied.Done()
			io.Copy(buf, c)
		}()
	}
	env := o.env
	if env == nil {
		env = []string{"PATH=/usr/bin:/bin", "LANG=C"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := ta.api.Exec(ctx, &vmagentv1.ExecRequest{
		Id: id, Args: args, Env: env, Cwd: o.cwd,
		Stdin: o.stdin, Stdout: true, Stderr: true,
	})
	return p, err
}

func (ta *testAgent) mustExec(t *testing.T, id string, o execOpts, args ...string) *proc {
	t.Helper()
	p, err := ta.exec(t, id, o, args...)
	if err != nil {
		t.Fatalf("exec %s %q: %v", id, args, err)
	}
	return p
}

func (ta *testAgent) wait(t *testing.T, p *proc) (int32, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := ta.api.Wait(ctx, &vmagentv1.WaitRequest{Id: p.id})
	if err != nil {
		t.Fatalf("wait %s: %v", p.id, err)
	}
	p.copied.Wait()
	return w.GetExitCode(), w.GetReason()
}

func (ta *testAgent) signal(id string, sig unix.Signal, all bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ta.api.Signal(ctx, &vmagentv1.SignalRequest{Id: id, Signal: uint32(sig), All: all})
	return rpcstatus.FromStatus(err)
}

func TestExecOutputAndExitCode(t *testing.T) {
	ta := startTestAgent(t)
	p := ta.mustExec(t, "p1", execOpts{}, "sh", "-c", "echo out; echo err >&2; exit 3")
	code, reason := ta.wait(t, p)
	if code != 3 || reason != "" || p.out.String() != "out\n" || p.err.String() != "err\n" {
		t.Errorf("exit %d %q, stdout %q, stderr %q; want 3, \"\", \"out\\n\", \"err\\n\"", code, reason, p.out, p.err)
	}
}

func TestExecStdinCrossesWithEOF(t *testing.T) {
	ta := startTestAgent(t)
	p := ta.mustExec(t, "cat", execOpts{stdin: true}, "cat")
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go func() {
		p.stdin.Write(want)
		p.stdin.Close() // end of file reaches cat
	}()
	code, _ := ta.wait(t, p)
	if code != 0 || !bytes.Equal(p.out.Bytes(), want) {
		t.Errorf("cat: exit %d, %d bytes out; want 0 and the %d bytes in", code, p.out.Len(), len(want))
	}
	// No stdin stream: /dev/null.
	p = ta.mustExec(t, "cat2", execOpts{}, "cat")
	if code, _ := ta.wait(t, p); code != 0 || p.out.Len() != 0 {
		t.Errorf("cat without stdin: exit %d, %q out; want 0, nothing", code, p.out)
	}
}

func TestExecCannotRun(t *testing.T) {
	ta := startTestAgent(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "noexec"), []byte("#!/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "badinterp"), []byte("#!/no/such/interpreter\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "tool"), []byte("#!/bin/sh\necho tool \"$@\"\n"), 0o755)
	tests := []struct {
		name   string
		o      execOpts
		args   []string
		code   int32
		reason string
		out    string
	}{
		{"not found", execOpts{}, []string{"no-such-command-x"}, 127, "executable file not found in $PATH", ""},
		{"absent path", execOpts{}, []string{"/no/such/file"}, 127, "no such file or directory", ""},
		{"not executable", execOpts{}, []string{filepath.Join(dir, "noexec")}, 126, "permission denied", ""},
		{"a directory", execOpts{}, []string{dir}, 126, "is a directory", ""},
		{"not executable on PATH", execOpts{env: []string{"PATH=" + dir}}, []string{"noexec"}, 126, "permission denied", ""},
		{"missing interpreter", execOpts{}, []string{filepath.Join(dir, "badinterp")}, 127, "no such file or directory", ""},
		{"missing cwd", execOpts{cwd: filepath.Join(dir, "absent")}, []string{"/bin/true"}, 126, "chdir", ""},
		{"found on the process's PATH", execOpts{env: []string{"PATH=/nonexistent:" + dir}}, []string{"tool", "a"}, 0, "", "tool a\n"},
		{"relative to cwd", execOpts{cwd: dir}, []string{"./tool", "b"}, 0, "", "tool b\n"},
		{"no PATH: the default", execOpts{env: []string{}}, []string{"true"}, 0, "", ""},
	}
	for i, tt := range tests {
		p := ta.mustExec(t, fmt.Sprintf("c%d", i), tt.o, tt.args...)
		code, reason := ta.wait(t, p)
		if code != tt.code || !strings.Contains(reason, tt.reason) || p.out.String() != tt.out {
			t.Errorf("%s: exit %d %q, stdout %q; want %d with %q, stdout %q", tt.name, code, reason, p.out, tt.code, tt.reason, tt.out)
		}
	}
}

func TestExecRefusesBadRequests(t *testing.T) {
	ta := startTestAgent(t)
	ctx := context.Background()
	for _, req := range []*vmagentv1.ExecRequest{
		{Id: "", Args: []string{"true"}},
		{Id: "a b", Args: []string{"true"}},
		{Id: "x1"},
		{Id: "x2", Args: []string{""}},
		{Id: "x3", Args: []string{"true"}, Env: []string{"NOEQUALS"}},
		{Id: "x4", Args: []string{"true"}, Env: []string{"=v"}},
		{Id: "x5", Args: []string{"true"}, Cwd: "relative"},
		{Id: "x6", Args: []string{"a\x00b"}},
		// A user is written into the account files when the image lacks it.
		{Id: "x7", Args: []string{"true"}, User: "a:0:0::/:/bin/sh\nb", Uid: 10001},
		{Id: "x8", Args: []string{"true"}, User: "agent"},
	} {
		_, err := ta.api.Exec(ctx, req)
		if !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrInvalidArgument) {
			t.Errorf("Exec(%+v) = %v, want an invalid-argument error", req, err)
		}
	}
}

func TestExecStreams(t *testing.T) {
	ta := startTestAgent(t)
	ctx := context.Background()
	// A named stream that never comes.
	_, err := ta.api.Exec(ctx, &vmagentv1.ExecRequest{Id: "s1", Args: []string{"true"}, Stdout: true})
	if !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "stdout") {
		t.Errorf("Exec naming a stream never opened = %v, want a failed-precondition error naming stdout", err)
	}
	// The id is free again.
	p := ta.mustExec(t, "s1", execOpts{}, "echo", "again")
	if code, _ := ta.wait(t, p); code != 0 || p.out.String() != "again\n" {
		t.Errorf("exec after a failed exec of the same id: exit %d, %q", code, p.out)
	}
	// The same id twice.
	_, err = ta.api.Exec(ctx, &vmagentv1.ExecRequest{Id: "s1", Args: []string{"true"}})
	if !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrAlreadyExists) {
		t.Errorf("Exec of an id in use = %v, want already-exists", err)
	}
	// A stream for a process already started is closed at once.
	late := ta.open(t, vmtransport.KindStdout, "s1")
	late.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := late.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a stream of a started process: read %d, %v; want end of file", n, err)
	}
	// A stream registered before an Exec that does not name it is used.
	out := ta.open(t, vmtransport.KindStdout, "legacy")
	waitPending(t, ta.svc.streams, 1)
	if _, err := ta.api.Exec(ctx, &vmagentv1.ExecRequest{Id: "legacy", Args: []string{"echo", "legacy"}}); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(out); string(b) != "legacy\n" {
		t.Errorf("stdout of an Exec naming no stream = %q, want %q", b, "legacy\n")
	}
	// The same stream twice.
	ta.open(t, vmtransport.KindStdout, "dup")
	waitPending(t, ta.svc.streams, 1) // the agent reads prefaces concurrently
	dup := ta.open(t, vmtransport.KindStdout, "dup")
	dup.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := dup.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a second stdout stream of one process: %v, want it closed", err)
	}
}

func waitPending(t *testing.T, p *pendingStreams, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.mu.Lock()
		count := p.count
		p.mu.Unlock()
		if count >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d streams pending after 5s, want %d", count, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestBadPrefaceIsClosed(t *testing.T) {
	ta := startTestAgent(t)
	for _, preface := range []string{"bogus\n", "stdout ../x\n", strings.Repeat("x", 300)} {
		c := ta.open(t, "", "")
		io.WriteString(c, preface)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("after preface %.20q: %v, want the agent to close the connection", preface, err)
		}
	}
	// The agent still serves.
	if _, err := ta.api.Health(context.Background(), &vmagentv1.HealthRequest{}); err != nil {
		t.Error(err)
	}
}

func TestSignalAndWait(t *testing.T) {
	ta := startTestAgent(t)
	p := ta.mustExec(t, "sleep", execOpts{}, "sleep", "60")
	if err := ta.signal("sleep", 0, false); err != nil {
		t.Errorf("signal 0 to a running process: %v", err)
	}
	if err := ta.signal("sleep", unix.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	code, reason := ta.wait(t, p)
	if code != 128+15 || reason != "killed by signal 15 (SIGTERM)" {
		t.Errorf("after SIGTERM: exit %d %q, want 143 \"killed by signal 15 (SIGTERM)\"", code, reason)
	}
	if err := ta.signal("sleep", unix.SIGTERM, false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("signal to an exited process = %v, want failed-precondition", err)
	}
	if err := ta.signal("nope", unix.SIGTERM, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("signal to an unknown process = %v, want not-found", err)
	}
	if err := ta.signal("", unix.SIGTERM, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("signal without an id or all = %v, want invalid-argument", err)
	}
	if err := ta.signal("sleep", 65, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("signal 65 = %v, want invalid-argument", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ta.api.Wait(ctx, &vmagentv1.WaitRequest{Id: "nope"}); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrNotFound) {
		t.Errorf("wait for an unknown process = %v, want not-found", err)
	}
}

// childPid starts sh with a background sleep and returns the sleep's pid.
func childPid(t *testing.T, ta *testAgent, id string) (*proc, int) {
	t.Helper()
	p := &proc{id: id, out: new(bytes.Buffer), err: new(bytes.Buffer)}
	out := ta.open(t, vmtransport.KindStdout, id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ta.api.Exec(ctx, &vmagentv1.ExecRequest{
		Id: id, Args: []string{"sh", "-c", "sleep 60 & echo $!; wait"}, Env: []string{"PATH=/usr/bin:/bin"}, Stdout: true,
	}); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	return p, pid
}

// gone reports whether pid has ended (a zombie counts: this machine's init
// may not reap the orphan).
func gone(pid int) bool {
	for range 200 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func TestSignalEveryProcess(t *testing.T) {
	for _, id := range []string{"", "e1"} { // all, with or without a process named
		ta := startTestAgent(t)
		p1, c1 := childPid(t, ta, "e1")
		p2, c2 := childPid(t, ta, "e2")
		if err := ta.signal(id, unix.SIGKILL, true); err != nil {
			t.Fatal(err)
		}
		for _, p := range []*proc{p1, p2} {
			if code, reason := ta.wait(t, p); code != 137 || !strings.Contains(reason, "SIGKILL") {
				t.Errorf("%s after SIGKILL to all: exit %d %q, want 137", p.id, code, reason)
			}
		}
		for _, c := range []int{c1, c2} {
			if !gone(c) {
				t.Errorf("background child %d survived SIGKILL to every process", c)
				unix.Kill(c, unix.SIGKILL)
			}
		}
		if err := ta.signal("absent", unix.SIGKILL, true); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("signal all naming an unknown process = %v, want not-found", err)
		}
	}
}

func TestSignalEveryProcessNoneLeft(t *testing.T) {
	ta := startTestAgent(t)
	if err := ta.signal("", unix.SIGTERM, true); err != nil {
		t.Errorf("signal all with no process = %v, want nil", err)
	}
	p, child := childPid(t, ta, "x")
	if err := ta.signal("", unix.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	ta.wait(t, p)
	gone(child)
	if err := ta.signal("", unix.SIGKILL, true); err != nil {
		t.Errorf("signal all once every process has exited = %v, want nil", err)
	}
}

func TestSignalEveryProcessTwoAgents(t *testing.T) {
	// Sanity: an agent outside PID 1 signals only the groups it started.
	ta, other := startTestAgent(t), startTestAgent(t)
	p, c := childPid(t, ta, "mine")
	q, d := childPid(t, other, "theirs")
	if err := ta.signal("", unix.SIGKILL, true); err != nil {
		t.Fatal(err)
	}
	if code, _ := ta.wait(t, p); code != 137 || !gone(c) {
		t.Errorf("after SIGKILL to all: exit %d; want 137 and its child gone", code)
	}
	if err := other.signal("theirs", 0, false); err != nil {
		t.Errorf("another agent's process was hit: %v", err)
	}
	other.signal("", unix.SIGKILL, true)
	other.wait(t, q)
	gone(d)
}

func TestWaitIsBoundedByADescendantHoldingOutput(t *testing.T) {
	ta := startTestAgent(t)
	p := ta.mustExec(t, "bg", execOpts{}, "sh", "-c", "sleep 30 & echo started")
	start := time.Now()
	code, _ := ta.wait(t, p) // also waits for the stream copies on the host side
	if code != 0 || p.out.String() != "started\n" {
		t.Errorf("exit %d, stdout %q; want 0, \"started\\n\"", code, p.out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait took %v with a descendant holding stdout, want about the drain time", d)
	}
	ta.signal("bg", unix.SIGKILL, true)
}

func TestWaitReturnsAfterTheOutput(t *testing.T) {
	ta := startTestAgent(t)
	const size = 4 << 20
	for i := range 3 {
		id := fmt.Sprintf("big%d", i)
		p := ta.mustExec(t, id, execOpts{}, "head", "-c", strconv.Itoa(size), "/dev/zero")
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := ta.api.Wait(ctx, &vmagentv1.WaitRequest{Id: id})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		// Wait has answered: the agent has sent everything and closed the
		// stream, so the copy ends without waiting on the process.
		done := make(chan struct{})
		go func() { p.copied.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("stdout still open after Wait answered")
		}
		if p.out.Len() != size {
			t.Errorf("%s: %d bytes of stdout, want %d", id, p.out.Len(), size)
		}
	}
}

func TestConcurrentExecs(t *testing.T) {
	ta := startTestAgent(t)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("c%d", i)
			p, err := ta.exec(t, id, execOpts{}, "sh", "-c", fmt.Sprintf("echo %d; exit %d", i, i%5))
			if err != nil {
				t.Error(err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w, err := ta.api.Wait(ctx, &vmagentv1.WaitRequest{Id: id})
			p.copied.Wait()
			if err != nil || w.GetExitCode() != int32(i%5) || p.out.String() != fmt.Sprintf("%d\n", i) {
				t.Errorf("%s: %v, %v, %q", id, w, err, p.out)
			}
		}()
	}
	wg.Wait()
}

func TestHealth(t *testing.T) {
	ta := startTestAgent(t)
	h, err := ta.api.Health(context.Background(), &vmagentv1.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h.GetKernel() != kernelRelease() || h.GetKernel() == "" || h.GetUptimeMs() == 0 || h.GetVersion() == "" {
		t.Errorf("Health = %+v", h)
	}
}

func TestSetupRules(t *testing.T) {
	ta := startTestAgent(t)
	ctx := context.Background()
	_, err := ta.api.Setup(ctx, &vmagentv1.SetupRequest{})
	if !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrInvalidArgument) {
		t.Errorf("Setup with no disks = %v, want invalid-argument", err)
	}
	// A failed Setup leaves a half-built guest: nothing more may run.
	_, err = ta.api.Setup(ctx, validSetup())
	if err == nil || !strings.Contains(err.Error(), "needs a VM") {
		t.Errorf("Setup = %v, want the stand-in's error", err)
	}
	if _, err := ta.exec(t, "after", execOpts{}, "true"); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("Exec after a failed Setup = %v, want failed-precondition", err)
	}
	if _, err := ta.api.Setup(ctx, validSetup()); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("a second Setup = %v, want failed-precondition", err)
	}

	ta = startTestAgent(t)
	ta.wait(t, ta.mustExec(t, "first", execOpts{}, "true"))
	if _, err := ta.api.Setup(ctx, validSetup()); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("Setup after an Exec = %v, want failed-precondition", err)
	}
}

// TestTrustRules: the session CA comes after Setup (it changes the root
// Setup built) and before any Exec (a process started earlier could have
// read the store without it), once, as one PEM certificate.
func TestTrustRules(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
	ctx := context.Background()
	ta := startTestAgent(t)
	var trusted []string
	ta.svc.setup = func(setupPaths, setupPlan, func(string, ...any)) error { return nil }
	ta.svc.trust = func(pem string) error { trusted = append(trusted, pem); return nil }
	if _, err := ta.api.Trust(ctx, &vmagentv1.TrustRequest{SessionCaPem: ca}); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("Trust before Setup = %v, want failed-precondition", err)
	}
	if _, err := ta.api.Setup(ctx, validSetup()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "not a certificate", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
		"-----BEGIN CERTIFICATE-----\n" + strings.Repeat("A", maxSessionCA) + "\n-----END CERTIFICATE-----\n"} {
		if _, err := ta.api.Trust(ctx, &vmagentv1.TrustRequest{SessionCaPem: bad}); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrInvalidArgument) {
			t.Errorf("Trust of %.30q = %v, want invalid-argument", bad, err)
		}
	}
	if _, err := ta.api.Trust(ctx, &vmagentv1.TrustRequest{SessionCaPem: ca}); err != nil {
		t.Fatalf("Trust after Setup: %v", err)
	}
	if _, err := ta.api.Trust(ctx, &vmagentv1.TrustRequest{SessionCaPem: ca}); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("a second Trust = %v, want failed-precondition", err)
	}
	if len(trusted) != 1 || trusted[0] != ca {
		t.Errorf("the guest trusted %q, want the one CA once", trusted)
	}

	ta = startTestAgent(t)
	ta.svc.setup = func(setupPaths, setupPlan, func(string, ...any)) error { return nil }
	ta.svc.trust = func(string) error { t.Error("Trust after an Exec changed the trust store"); return nil }
	if _, err := ta.api.Setup(ctx, validSetup()); err != nil {
		t.Fatal(err)
	}
	ta.wait(t, ta.mustExec(t, "first", execOpts{}, "true"))
	if _, err := ta.api.Trust(ctx, &vmagentv1.TrustRequest{SessionCaPem: ca}); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("Trust after an Exec = %v, want failed-precondition", err)
	}
}

func TestShutdown(t *testing.T) {
	ta := startTestAgent(t)
	ctx := context.Background()
	for range 2 {
		if _, err := ta.api.Shutdown(ctx, &vmagentv1.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(3 * shutdownGrace)
	if n := ta.powerOffs.Load(); n != 1 {
		t.Errorf("power off ran %d times after two Shutdowns, want 1", n)
	}
	if _, err := ta.exec(t, "late", execOpts{}, "true"); !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
		t.Errorf("Exec after Shutdown = %v, want failed-precondition", err)
	}
}
