package shimv1

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// scriptShim writes an executable shell script that stands for a shim's
// serve: it records its pid in dir/pid, then runs body.
func scriptShim(t *testing.T, dir, body string) string {
	t.Helper()
	path := filepath.Join(dir, "shim")
	script := fmt.Sprintf("#!/bin/sh\necho $$ > %s/pid\n%s\n", dir, body)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func shimPID(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// gone waits (bounded) until pid is no process at all: exited and reaped.
// A zombie is still listed in /proc, so this fails when no one reaps it.
func gone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			t.Fatalf("pid %d is still there (not reaped?): %s", pid, stat)
		}
	}
}

// A shim that reports ready runs in a session of its own, with the
// listener, its output in shim.log and nothing of the caller's environment
// but PATH; once it exits, it is reaped.
func TestLaunchReady(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("LAUNCH_TEST_MARKER", "must-not-reach-the-shim")
	bin := scriptShim(t, dir, `env; [ -S /proc/self/fd/3 ] || ls -l /proc/self/fd/3
echo "{\"pid\":$$,\"startTime\":7}" >&4
exec sleep 60`)
	socket := filepath.Join(dir, "shim.sock")
	ready, err := Launch(context.Background(), bin, dir, socket, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := shimPID(t, dir)
	defer syscall.Kill(pid, syscall.SIGKILL)
	if ready.PID != pid || ready.StartTime != 7 || ready.Address != socket {
		t.Errorf("Ready = %+v, want pid %d, start time 7, address %s", ready, pid, socket)
	}
	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("the shim's session = %d, %v; want its own (%d)", sid, err, pid)
	}
	if fi, err := os.Stat(socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket: %v, %v; want it there, 0600", fi, err)
	}
	log, _ := os.ReadFile(filepath.Join(dir, "shim.log"))
	if !strings.Contains(string(log), "PATH=") || strings.Contains(string(log), "LAUNCH_TEST_MARKER") {
		t.Errorf("shim.log (the shim's env and fd 3) = %q; want PATH and not the caller's other variables", log)
	}
	if strings.Contains(string(log), "fd/3") {
		t.Errorf("fd 3 is not the socket's listener: %s", log)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	gone(t, pid)
}

// Whatever keeps a shim from being ready (it exits, it reports an error, it
// never answers within the context) ends with it killed and reaped, its
// socket removed, and an error that says why.
func TestLaunchNotReady(t *testing.T) {
	for _, c := range []struct {
		name, body, want string
		timeout          time.Duration
	}{
		{"exits", "exit 3", "did not report ready: EOF (see shim.log", 0},
		{"reports an error", `echo '{"error":"no runner for strategy x"}' >&4; exec sleep 60`, "no runner for strategy x", 0},
		{"another pid", `echo '{"pid":1}' >&4; exec sleep 60`, "reported ready as pid 1", 0},
		{"never answers", "exec sleep 60", "not ready after 200ms", 200 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := scriptShim(t, dir, c.body)
			socket := filepath.Join(dir, "shim.sock")
			ctx := context.Background()
			if c.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeoutCause(ctx, c.timeout, fmt.Errorf("not ready after %v", c.timeout))
				defer cancel()
			}
			_, err := Launch(ctx, bin, dir, socket, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Launch = %v, want an error with %q", err, c.want)
			}
			gone(t, shimPID(t, dir))
			if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("socket left: %v", err)
			}
		})
	}
}

// A binary that cannot start is an error at once, with nothing left.
func TestLaunchMissingBinary(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "shim.sock")
	_, err := Launch(context.Background(), filepath.Join(dir, "no-such-shim"), dir, socket, nil)
	if err == nil || !strings.Contains(err.Error(), "no-such-shim") {
		t.Errorf("Launch = %v, want an error naming the binary", err)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left: %v", err)
	}
}
