package host

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
	"github.com/agentconnect-md/agentconnect/shim"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// The test binary is a shim with the host runner too: startShim launches
// /proc/self/exe as one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "serve", "init":
			cfg := shim.Config{Name: "agentconnect-shim", Runners: map[strategy.Name]shim.Runner{strategy.Host: Runner{}}}
			if err := shim.Main(os.Args[1:], cfg); err != nil {
				os.Stderr.WriteString("agentconnect-shim: " + err.Error() + "\n")
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	// What a shim leaves is reparented to this process, which reaps it in
	// waitGone.
	unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	os.Exit(m.Run())
}

type started struct {
	dir    session.Dir
	ready  shimv1.Ready
	client shimv1.ShimService
	conn   *ttrpclite.Client
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
	rec := &session.Record{ID: "s1", Run: 1, Strategy: strategy.Host, Spec: session.Spec{
		Command: command, Env: []string{"PATH=/usr/bin:/bin", "HOME=" + root}, Workspace: ws,
	}}
	if edit != nil {
		edit(&rec.Spec)
	}
	if err := dir.WriteRecord(rec); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(root, "shim.sock")
	ready, err := shimv1.Launch(context.Background(), "/proc/self/exe", string(dir), socket, nil)
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	conn, err := net.Dial("unix", ready.Address)
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpclite.NewClient(conn)
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

func limitMiB(n int64) func(*session.Spec) {
	return func(s *session.Spec) { s.OutputLimitMiB = n }
}

// checkOutputBound checks output.log against the documented bound: the
// limit plus one notice record.
func checkOutputBound(t *testing.T, dir session.Dir, limit int64) {
	t.Helper()
	fi, err := os.Stat(dir.OutputPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > limit+16+outputlog.MaxNotice {
		t.Errorf("output.log is %d bytes, over the limit %d plus one notice", fi.Size(), limit)
	}
	if fi.Size() < limit {
		t.Errorf("output.log is %d bytes, short of the limit %d: output was lost before it", fi.Size(), limit)
	}
}

// TestOutputLimitStopsTheRun: a runtime that writes past its session's
// output limit is stopped with SIGTERM, and the reason says why; the log
// ends with a notice and stays within the limit plus that notice.
func TestOutputLimitStopsTheRun(t *testing.T) {
	s := startShimIn(t, t.TempDir(), limitMiB(1), "sh", "-c", "echo start; exec yes 0123456789abcdef")
	ctx := context.Background()
	if _, err := s.client.Start(ctx, &shimv1.StartRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := s.client.Wait(ctx, &shimv1.WaitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if w.ExitCode != 143 || w.Reason != "output limit of 1 MiB reached; killed by signal 15 (SIGTERM)" {
		t.Errorf("exit %d, reason %q; want 143 and the output limit", w.ExitCode, w.Reason)
	}
	checkOutputBound(t, s.dir, 1<<20)
	stdout, stderr := readLog(t, s.dir)
	if !strings.HasPrefix(stdout, "start\n0123456789abcdef\n") || !strings.Contains(stderr, "output limit of 1 MiB reached") {
		t.Errorf("output: stdout starts %q, stderr %q", stdout[:min(len(stdout), 40)], stderr)
	}
	if st, _ := s.dir.ReadStatus(); st == nil || st.Reason != w.Reason {
		t.Errorf("status.json = %+v, want the reason %q", st, w.Reason)
	}
}

// TestOutputLimitKillsWhatIgnoresSIGTERM: a runtime that ignores SIGTERM
// and goes on writing is killed after the grace period, and what it wrote
// meanwhile is dropped.
func TestOutputLimitKillsWhatIgnoresSIGTERM(t *testing.T) {
	s := startShimIn(t, t.TempDir(), limitMiB(1), "sh", "-c", `trap "" TERM; exec yes 0123456789abcdef`)
	ctx := context.Background()
	if _, err := s.client.Start(ctx, &shimv1.StartRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := s.client.Wait(ctx, &shimv1.WaitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if w.ExitCode != 137 || !strings.HasPrefix(w.Reason, "output limit of 1 MiB reached") {
		t.Errorf("exit %d, reason %q; want 137 and the output limit", w.ExitCode, w.Reason)
	}
	checkOutputBound(t, s.dir, 1<<20)
}

// TestFullOutputLogRefusesARun: a resumed session whose log is already at
// its limit does not start, with the reason.
func TestFullOutputLogRefusesARun(t *testing.T) {
	root := t.TempDir()
	dir := session.Dir(filepath.Join(root, "s"))
	os.Mkdir(string(dir), 0o700)
	w, err := outputlog.OpenWriter(dir.OutputPath(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for w.Write(outputlog.Stdout, make([]byte, 64<<10)) == nil {
	}
	w.Close()
	s := startShimIn(t, root, limitMiB(1), "sh", "-c", "echo should not run")
	_, err = s.client.Start(context.Background(), &shimv1.StartRequest{})
	if err == nil || !strings.Contains(err.Error(), "output limit of 1 MiB reached") {
		t.Fatalf("Start on a full log = %v, want the output limit", err)
	}
	if st, _ := s.dir.ReadStatus(); st == nil || st.State != session.Exited || !strings.Contains(st.Reason, "output.log is full") {
		t.Errorf("status.json = %+v", st)
	}
	if stdout, _ := readLog(t, dir); strings.Contains(stdout, "should not run") {
		t.Error("the runtime ran")
	}
}
