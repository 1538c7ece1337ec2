package shim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// The test binary is the shim too: the bootstrap re-executes /proc/self/exe.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "start", "serve", "init":
			if err := Main(os.Args[1:], os.Stdout); err != nil {
				os.Stderr.WriteString("agentconnect-shim: " + err.Error() + "\n")
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	// Shims are reparented to this process, which reaps them in waitGone.
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	os.Exit(m.Run())
}

type started struct {
	dir    session.Dir
	ready  shimv1.Ready
	client shimv1.ShimService
	conn   *ttrpc.Client
}

// startShim writes a session for command and bootstraps a shim for it.
func startShim(t *testing.T, command ...string) *started {
	t.Helper()
	return startShimIn(t, t.TempDir(), nil, command...)
}

// startShimIn is startShim in root (a session directory "s" there may
// already hold files), with the spec changed by edit.
func startShimIn(t *testing.T, root string, edit func(*session.Spec), command ...string) *started {
	t.Helper()
	ws := filepath.Join(root, "ws")
	os.Mkdir(ws, 0o700)
	dir := session.Dir(filepath.Join(root, "s"))
	os.Mkdir(string(dir), 0o700)
	rec := &session.Record{ID: "s1", Run: 1, Spec: session.Spec{
		Command: command, Env: []string{"PATH=/usr/bin:/bin", "HOME=" + root}, Workspace: ws,
	}}
	if edit != nil {
		edit(&rec.Spec)
	}
	if err := dir.WriteRecord(rec); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(root, "shim.sock")
	var stdout bytes.Buffer
	cmd := exec.Command("/proc/self/exe", "start", "--session-dir", string(dir), "--socket", socket)
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	var ready shimv1.Ready
	if err := json.Unmarshal(stdout.Bytes(), &ready); err != nil {
		t.Fatalf("bootstrap printed %q: %v", stdout.String(), err)
	}
	conn, err := net.Dial("unix", ready.Address)
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpc.NewClient(conn)
	t.Cleanup(func() { c.Close(); syscall.Kill(ready.PID, syscall.SIGKILL); waitGone(t, ready.PID) })
	s := &started{dir: dir, ready: ready, client: shimv1.NewShimClient(c), conn: c}
	if _, err := s.client.Handshake(context.Background(), &shimv1.HandshakeRequest{ApiVersion: shimv1.APIVersion}); err != nil {
		t.Fatal(err)
	}
	return s
}

// waitGone waits for pid to exit and reaps it.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for procstat.Alive(pid, 0) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var ws syscall.WaitStatus
	syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
}

func readLog(t *testing.T, dir session.Dir) (stdout, stderr string) {
	t.Helper()
	f, err := os.Open(dir.OutputPath())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var o, e strings.Builder
	r := outputlog.NewReader(f, 0)
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return o.String(), e.String()
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Stream == outputlog.Stdout {
			o.Write(rec.Data)
		} else {
			e.Write(rec.Data)
		}
	}
}

func TestRunStdioAndExit(t *testing.T) {
	s := startShim(t, "sh", "-c", `echo out; echo err >&2; read line; echo "got $line in $(pwd)"; exit 3`)
	ctx := context.Background()
	st, err := s.client.Start(ctx, &shimv1.StartRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Start(ctx, &shimv1.StartRequest{}); err == nil {
		t.Error("a second Start succeeded")
	}
	w, err := s.client.WriteStdin(ctx, &shimv1.WriteStdinRequest{Data: []byte("hello\n")})
	if err != nil || w.Written != 6 {
		t.Fatalf("WriteStdin = %v, %v", w, err)
	}
	if _, err := s.client.CloseStdin(ctx, &shimv1.CloseStdinRequest{}); err != nil {
		t.Fatal(err)
	}
	res, err := s.client.Wait(ctx, &shimv1.WaitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 3 {
		t.Errorf("exit code = %d, want 3", res.ExitCode)
	}
	if _, err := s.client.Shutdown(ctx, &shimv1.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	stdout, stderr := readLog(t, s.dir)
	if !strings.HasPrefix(stdout, "out\ngot hello in ") || !strings.HasSuffix(stdout, "/ws\n") {
		t.Errorf("stdout = %q", stdout)
	}
	if stderr != "err\n" {
		t.Errorf("stderr = %q, want %q", stderr, "err\n")
	}
	status, err := s.dir.ReadStatus()
	if err != nil || status.State != session.Exited || status.ExitCode != 3 || int(st.Pid) != status.PID {
		t.Errorf("status.json = %+v, %v", status, err)
	}
	waitGone(t, s.ready.PID)
}

func TestExecErrors(t *testing.T) {
	for _, tc := range []struct {
		command []string
		code    int32
	}{
		{[]string{"no-such-runtime-anywhere"}, 127},
		{[]string{"/etc/passwd"}, 126},
	} {
		s := startShim(t, tc.command...)
		if _, err := s.client.Start(context.Background(), &shimv1.StartRequest{}); err != nil {
			t.Fatal(err)
		}
		res, err := s.client.Wait(context.Background(), &shimv1.WaitRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != tc.code || res.Reason == "" {
			t.Errorf("%v: exit %d reason %q, want %d with a reason", tc.command, res.ExitCode, res.Reason, tc.code)
		}
	}
}

func TestShimDeathKillsRuntime(t *testing.T) {
	s := startShim(t, "sh", "-c", "sleep 600 & sleep 600")
	st, err := s.client.Start(context.Background(), &shimv1.StartRequest{})
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(s.ready.PID, syscall.SIGKILL)
	waitGone(t, s.ready.PID)
	// The runtime dies by Pdeathsig; it was the shim's child, now ours.
	deadline := time.Now().Add(5 * time.Second)
	for procstat.Alive(int(st.Pid), 0) {
		if time.Now().After(deadline) {
			t.Fatal("runtime outlived its shim")
		}
		time.Sleep(5 * time.Millisecond)
	}
	syscall.Kill(-int(st.Pid), syscall.SIGKILL) // the background sleep: the supervisor's cleanup job
}

func TestKillAllEndsBackgroundProcesses(t *testing.T) {
	s := startShim(t, "sh", "-c", "sleep 600 & echo $!; wait")
	ctx := context.Background()
	if _, err := s.client.Start(ctx, &shimv1.StartRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Kill(ctx, &shimv1.KillRequest{Signal: uint32(syscall.SIGTERM), All: true}); err != nil {
		t.Fatal(err)
	}
	res, err := s.client.Wait(ctx, &shimv1.WaitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 128+int32(syscall.SIGTERM) {
		t.Errorf("exit code = %d, want %d", res.ExitCode, 128+syscall.SIGTERM)
	}
}

// TestRuntimeOOMScoreIsReset: a supervisor favoured by the OOM killer
// (systemd's OOMScoreAdjust) must not pass that on to its sessions.
func TestRuntimeOOMScoreIsReset(t *testing.T) {
	const path = "/proc/self/oom_score_adj"
	old, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte("-200"), 0); err != nil {
		t.Skipf("cannot lower this process's oom_score_adj (%v): that needs CAP_SYS_RESOURCE; TestResetOOMScore covers the rule", err)
	}
	t.Cleanup(func() { os.WriteFile(path, old, 0) })
	s := startShim(t, "sh", "-c", "cat /proc/self/oom_score_adj")
	if _, err := s.client.Start(context.Background(), &shimv1.StartRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Wait(context.Background(), &shimv1.WaitRequest{}); err != nil {
		t.Fatal(err)
	}
	if stdout, _ := readLog(t, s.dir); strings.TrimSpace(stdout) != "0" {
		t.Errorf("the runtime's oom_score_adj = %q, want 0 (the supervisor's was -200)", stdout)
	}
}

func TestResetOOMScore(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"-500\n", "0"}, {"0\n", "0\n"}, {"300\n", "300\n"}} {
		path := filepath.Join(t.TempDir(), "oom_score_adj")
		os.WriteFile(path, []byte(tc.in), 0o600)
		resetOOMScore(path)
		if got, _ := os.ReadFile(path); string(got) != tc.want {
			t.Errorf("oom_score_adj %q becomes %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The reaper signals a child only until it has reaped it: after that, its
// pid may already name another process.
func TestReaperSignalsOnlyUnreapedChildren(t *testing.T) {
	r := newReaper()
	r.mu.Lock()
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "30"}, &os.ProcAttr{})
	if err != nil {
		r.mu.Unlock()
		t.Fatal(err)
	}
	pid := p.Pid
	exited := r.expectLocked(pid)
	r.mu.Unlock()
	p.Release()
	if !r.signal(pid, syscall.SIGKILL) {
		t.Fatal("signal of a running child reported it gone")
	}
	for {
		r.reap()
		select {
		case ws := <-exited:
			if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Errorf("child ended with %v, want SIGKILL", ws)
			}
			if r.signal(pid, syscall.SIGKILL) {
				t.Error("signal of a reaped child was sent")
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Every start this shim makes ends within the StartTimeout the supervisor
// waits for: a VM's boot and its guest calls, an srt sandbox's readiness.
func TestStartBoundsFitStartTimeout(t *testing.T) {
	for name, d := range map[string]time.Duration{
		"microsandbox": bootTimeout + vmCallTimeout,
		"srt":          2 * sandboxReadyTimeout,
	} {
		if d >= shimv1.StartTimeout {
			t.Errorf("%s start takes up to %v, not within shimv1.StartTimeout %v", name, d, shimv1.StartTimeout)
		}
	}
}
