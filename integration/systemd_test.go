package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sdRunArgs runs the CLI with exactly args (no --home) and a timeout.
func sdRunArgs(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentconnect(), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("agentconnect %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// sdDaemonLog is the log of a daemon a test in this file started.
func sdDaemonLog(home string) string {
	data, _ := os.ReadFile(filepath.Join(home, "daemon.log"))
	return string(data)
}

// sdExited reports whether cmd has ended, without reaping it.
func sdExited(cmd *exec.Cmd) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err != nil || info.Signo != 0
}

// sdStop sends SIGTERM to a daemon a test started and waits for it to end,
// SIGKILLing it after 10 s. It returns how the daemon ended.
func sdStop(t *testing.T, d *daemon) error {
	t.Helper()
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		<-done
		t.Fatalf("the daemon did not stop within 10s of SIGTERM; its log:\n%s", sdDaemonLog(d.home))
		return nil
	}
}

// sdStatus is the part of `status --json` these tests read.
type sdStatus struct {
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"startedAt"`
}

// sdCheckActivatedSocket checks that a socket-activated daemon recorded the
// socket it was given, so that --home alone finds it, and made none of its
// own in the home.
func sdCheckActivatedSocket(t *testing.T, home, sock string) {
	t.Helper()
	pointer, err := os.ReadFile(filepath.Join(home, "run", "admin-socket"))
	if err != nil {
		t.Errorf("the daemon did not record the activated socket: %v", err)
	} else if got := strings.TrimSpace(string(pointer)); got != sock {
		t.Errorf("run/admin-socket = %q, want %q", got, sock)
	}
	if _, err := os.Lstat(filepath.Join(home, "run", "agentconnect.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the daemon made an admin socket of its own in the home (lstat: %v); it should use the activated one only", err)
	}
}

// sdExecEcho runs the agent echo (sh -c 'echo hi') through exec.
func sdExecEcho(t *testing.T, home string) {
	t.Helper()
	r := run(t, home, "", "exec", "echo")
	if r.code != 0 || r.stdout != "hi\n" {
		t.Errorf("exec echo: exit %d, stdout %q, want exit 0 and %q; stderr: %s", r.code, r.stdout, "hi\n", r.stderr)
	}
}

// TestSocketActivation runs the daemon the way a systemd socket unit does:
// systemd-socket-activate listens, and on the first connection execs the
// daemon with the socket as fd 3 (LISTEN_FDS). The daemon must serve on that
// socket, make --home alone find it, run sessions, keep the socket across a
// SIGHUP re-exec (systemctl reload), and leave the socket file, which is
// systemd's, when it stops.
func TestSocketActivation(t *testing.T) {
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate is not installed (Debian: apt-get install systemd); socket activation is not tested")
	}
	home := newHome(t)
	sock := filepath.Join(t.TempDir(), "a.sock")
	log, err := os.OpenFile(filepath.Join(home, "daemon.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(activate, "-l", sock, agentconnect(), "--home", home, "run")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// systemd-socket-activate execs the daemon: this pid is the daemon's,
	// and the usual cleanup removes its sessions and stops it.
	d := &daemon{t: t, home: home, cmd: cmd, log: log}
	t.Cleanup(d.cleanup)

	// The first connection starts the daemon; it answers once it serves.
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := sdRunArgs(t, "--socket", sock, "status")
		if r.code == 0 {
			break
		}
		if sdExited(cmd) || time.Now().After(deadline) {
			t.Fatalf("no daemon answered on the activated socket %s (last status: exit %d: %s); its log:\n%s",
				sock, r.code, r.stderr, sdDaemonLog(home))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The daemon serves on the socket it was given and made none of its
	// own; it noted the path, so --home alone reaches it.
	var st sdStatus
	okJSON(t, home, &st, "status")
	if st.PID != cmd.Process.Pid {
		t.Errorf("status --json: pid = %d, want %d (the activated daemon)", st.PID, cmd.Process.Pid)
	}
	sdCheckActivatedSocket(t, home, sock)

	ok(t, home, "agent", "create", "echo", "--", "sh", "-c", "echo hi")
	sdExecEcho(t, home)

	// systemctl reload (ExecReload= sends SIGHUP): the daemon re-executes
	// itself and keeps serving on the socket it was given.
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the daemon answers again after SIGHUP", func() bool {
		var again sdStatus
		r := run(t, home, "", "status", "--json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &again) == nil && again.StartedAt.After(st.StartedAt)
	})
	okJSON(t, home, &st, "status")
	if st.PID != cmd.Process.Pid {
		t.Errorf("after SIGHUP, status --json: pid = %d, want %d (re-executed in place)", st.PID, cmd.Process.Pid)
	}
	sdCheckActivatedSocket(t, home, sock)
	sdExecEcho(t, home)

	// Stop it as systemd would (SIGTERM), after removing the session.
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls")
	for _, s := range sessions {
		ok(t, home, "session", "rm", "--force", s.ID)
	}
	if err := sdStop(t, d); err != nil {
		t.Errorf("the daemon ended with %v after SIGTERM, want exit 0; its log:\n%s", err, sdDaemonLog(home))
	}
	// The socket belongs to systemd, which keeps listening on it for the
	// next start: a daemon that unlinked it would cut every client off.
	if fi, err := os.Lstat(sock); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("after the daemon stopped, the activated socket %s: %v (mode %v), want it left in place", sock, err, fi)
	}
}

// TestNotifyReady runs the daemon with NOTIFY_SOCKET, as a Type=notify unit
// does, and checks that it sends READY=1, from its main pid (systemd's
// default NotifyAccess=main drops anything else), only once it answers.
func TestNotifyReady(t *testing.T) {
	home := newHome(t)
	notifyPath := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Ask for the sender's credentials with every message, as systemd does.
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil || sockErr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, sockErr)
	}

	type message struct {
		text string
		pid  int32
	}
	messages := make(chan message, 16)
	go func() {
		defer close(messages)
		buf := make([]byte, 4096)
		oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := message{text: string(buf[:n]), pid: -1}
			if cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, c := range cmsgs {
					if cred, err := unix.ParseUnixCredentials(&c); err == nil {
						m.pid = cred.Pid
					}
				}
			}
			messages <- m
		}
	}()

	log, err := os.OpenFile(filepath.Join(home, "daemon.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(agentconnect(), "--home", home, "run")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+notifyPath)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, home: home, cmd: cmd, log: log}
	t.Cleanup(d.cleanup)

	timeout := time.After(20 * time.Second)
	exited := time.NewTicker(50 * time.Millisecond)
	defer exited.Stop()
	for ready := false; !ready; {
		select {
		case m, open := <-messages:
			if !open {
				t.Fatal("the notify socket closed")
			}
			t.Logf("notify from pid %d: %q", m.pid, m.text)
			for _, line := range strings.Split(m.text, "\n") {
				if line != "READY=1" {
					continue
				}
				if int(m.pid) != cmd.Process.Pid {
					t.Errorf("READY=1 came from pid %d, want the daemon's main pid %d", m.pid, cmd.Process.Pid)
				}
				ready = true
			}
		case <-exited.C:
			if sdExited(cmd) {
				t.Fatalf("the daemon exited before READY=1; its log:\n%s", sdDaemonLog(home))
			}
		case <-timeout:
			t.Fatalf("no READY=1 within 20s; its log:\n%s", sdDaemonLog(home))
		}
	}
	// READY means it serves: the first status must answer, with no retry.
	var st sdStatus
	okJSON(t, home, &st, "status")
	if st.PID != cmd.Process.Pid {
		t.Errorf("status --json: pid = %d, want %d", st.PID, cmd.Process.Pid)
	}

	if err := sdStop(t, d); err != nil {
		t.Errorf("the daemon ended with %v after SIGTERM, want exit 0; its log:\n%s", err, sdDaemonLog(home))
	}
	// READY=1 is sent once per start: none may follow while it stops.
	conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	for m := range messages {
		t.Logf("notify from pid %d after READY: %q", m.pid, m.text)
		if strings.Contains("\n"+m.text+"\n", "\nREADY=1\n") {
			t.Errorf("a second READY=1 (pid %d): %q", m.pid, m.text)
		}
	}
}
