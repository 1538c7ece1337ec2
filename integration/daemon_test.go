package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

type statusOut struct {
	Daemon     string `json:"daemon"`
	PID        int    `json:"pid"`
	StartedAt  string `json:"startedAt"`
	ConfigPath string `json:"configPath"`
	Strategies []struct {
		Name      string `json:"name"`
		Available bool   `json:"available"`
		Reason    string `json:"reason"`
	} `json:"strategies"`
	Cgroups struct {
		Available bool   `json:"available"`
		Reason    string `json:"reason"`
	} `json:"cgroups"`
	LastStartupFailure string `json:"lastStartupFailure"`
}

func writeConfig(t *testing.T, dir, content string) string {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runDaemonExpectFailure runs `run` and expects it to exit non-zero on its
// own, returning its stderr.
func runDaemonExpectFailure(t *testing.T, home string, args ...string) string {
	t.Helper()
	r := run(t, home, "", append([]string{"run"}, args...)...)
	if r.code == 0 {
		t.Fatalf("run %v exited 0, want a failure", args)
	}
	return r.stderr
}

func TestRequireSandboxWithNoSandboxRefusesToStart(t *testing.T) {
	home := newHome(t)
	writeConfig(t, home, `{"sandbox": {"srt": false, "microsandbox": false}}`)
	stderr := runDaemonExpectFailure(t, home, "--require-sandbox")
	for _, want := range []string{"no execution strategy is available", "--require-sandbox", "sandbox.srt is off on this daemon", "sandbox.microsandbox is off on this daemon"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	// status: exit 3, and the last startup failure.
	r := run(t, home, "", "status")
	if r.code != 3 || !strings.Contains(r.stdout, "no execution strategy is available") {
		t.Errorf("status: exit %d, stdout %q; want 3 and the failure", r.code, r.stdout)
	}
	r = run(t, home, "", "status", "--json")
	var st statusOut
	if r.code != 3 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Daemon != "not running" || !strings.Contains(st.LastStartupFailure, "--require-sandbox") {
		t.Errorf("status --json: exit %d, %q", r.code, r.stdout)
	}
}

func TestRetiredRequireSandboxRefusesToStart(t *testing.T) {
	home := newHome(t)
	writeConfig(t, home, `{"security": {"requireSandbox": true}, "sandbox": {"srt": false, "microsandbox": false}}`)
	stderr := runDaemonExpectFailure(t, home)
	if !strings.Contains(stderr, "security.requireSandbox is retired") {
		t.Errorf("no warning naming security.requireSandbox:\n%s", stderr)
	}
	if !strings.Contains(stderr, "security.requireSandbox turns host off") {
		t.Errorf("the reason does not name security.requireSandbox:\n%s", stderr)
	}
}

func TestBadConfigStopsStart(t *testing.T) {
	home := newHome(t)
	writeConfig(t, home, `{"sandbox": {"microsandbox": {"memoryMiB": "lots"}}}`)
	stderr := runDaemonExpectFailure(t, home)
	if !strings.Contains(stderr, "sandbox.microsandbox.memoryMiB") {
		t.Errorf("the error does not name the key:\n%s", stderr)
	}
	if r := run(t, home, "", "status"); r.code != 3 || !strings.Contains(r.stdout, "memoryMiB") {
		t.Errorf("status after a bad config: exit %d, %q", r.code, r.stdout)
	}
}

func TestSIGHUPKeepsFlags(t *testing.T) {
	home := newHome(t)
	cfgDir := t.TempDir()
	cfg := writeConfig(t, cfgDir, `{"logLevel": "debug"}`)
	d := startDaemon(t, home, "--config", cfg)
	ok(t, home, "agent", "create", "sleeper", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	before := show(t, home, id)
	var st1 statusOut
	okJSON(t, home, &st1, "status")
	if st1.ConfigPath != cfg {
		t.Fatalf("configPath = %q, want %q", st1.ConfigPath, cfg)
	}

	// A signal, then the restart command: each keeps the flags.
	if err := syscall.Kill(d.pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var st2 statusOut
	eventually(t, 20*time.Second, "the daemon restarts in place", func() bool {
		r := run(t, home, "", "status", "--json")
		return r.code == 0 && json.Unmarshal([]byte(r.stdout), &st2) == nil && st2.StartedAt != st1.StartedAt
	})
	out := ok(t, home, "restart")
	if !strings.Contains(out, "restarted") {
		t.Errorf("restart printed %q", out)
	}
	var st3 statusOut
	okJSON(t, home, &st3, "status")
	for _, st := range []statusOut{st2, st3} {
		if st.PID != d.pid() || st.ConfigPath != cfg {
			t.Errorf("after restart: pid %d config %q; want pid %d, config %q (the flag kept)", st.PID, st.ConfigPath, d.pid(), cfg)
		}
	}
	after := show(t, home, id)
	if after.State != "running" || after.PID != before.PID {
		t.Errorf("session after restarts: %+v, want running with pid %d", after, before.PID)
	}

	// The daemon starts its shims as its children, and a re-exec keeps its
	// pid: the new image reaps the shims of the old one when they exit,
	// rather than leave them zombies for as long as it runs.
	if before.ShimPID == 0 {
		t.Fatalf("session show names no shim pid: %+v", before)
	}
	if st, err := procstat.Read(before.ShimPID); err != nil || st.PPID != d.pid() {
		t.Errorf("shim %d: parent %v (%v), want the daemon (%d)", before.ShimPID, st.PPID, err, d.pid())
	}
	ok(t, home, "session", "stop", id)
	eventually(t, 20*time.Second, "the stopped session's shim is reaped, not left a zombie", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", before.ShimPID))
		return errors.Is(err, os.ErrNotExist)
	})
}

func TestStopCommandLeavesSessions(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	pid := show(t, home, id).PID
	ok(t, home, "stop")
	d.cmd.Wait()
	if r := run(t, home, "", "status"); r.code != 3 {
		t.Errorf("status after stop: exit %d, want 3", r.code)
	}
	if _, err := os.Stat(filepath.Join(home, "run", "agentconnect.sock")); !os.IsNotExist(err) {
		t.Errorf("admin socket left after stop: %v", err)
	}
	d.restart()
	if s := show(t, home, id); s.State != "running" || s.PID != pid {
		t.Errorf("session after stop and start: %+v", s)
	}
}

func TestSecondDaemonOnHome(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	stderr := runDaemonExpectFailure(t, home)
	if !strings.Contains(stderr, "already running") {
		t.Errorf("second daemon: %q, want it to say one is already running", stderr)
	}
	if r := run(t, home, "", "status"); r.code != 0 {
		t.Errorf("the first daemon stopped serving: %+v", r)
	}
}

// cgroupFile reads a file of the cgroup pid is in, for one controller (v1)
// or the unified hierarchy (v2).
func cgroupFile(t *testing.T, pid int, controller, file string) string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir string
		switch {
		case parts[1] == controller:
			dir = filepath.Join("/sys/fs/cgroup", controller, parts[2])
		case parts[0] == "0" && parts[1] == "":
			dir = filepath.Join("/sys/fs/cgroup", parts[2])
		default:
			continue
		}
		if v, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
			return strings.TrimSpace(string(v))
		}
	}
	t.Fatalf("no %s in the %s cgroup of pid %d", file, controller, pid)
	return ""
}

func TestSessionCgroupLimits(t *testing.T) {
	requireRoot(t)
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "limited", "--pids", "32", "--memory-mib", "64", "--cpus", "1", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "limited"))
	s := show(t, home, id)
	if s.Cgroup == "" || s.Limits != "pids 32, memory 64 MiB, cpus 1" {
		t.Fatalf("session: cgroup %q, limits %q", s.Cgroup, s.Limits)
	}
	var usage struct {
		Usage struct {
			Pids        int `json:"pids"`
			MemoryBytes int `json:"memoryBytes"`
		} `json:"usage"`
	}
	okJSON(t, home, &usage, "session", "show", id)
	if usage.Usage.Pids != 1 || usage.Usage.MemoryBytes == 0 {
		t.Errorf("usage of a running sleep: %+v, want 1 pid and some memory", usage.Usage)
	}
	if got := cgroupFile(t, s.PID, "pids", "pids.max"); got != "32" {
		t.Errorf("pids.max = %q, want 32", got)
	}
	mem := cgroupFile(t, s.PID, "memory", "memory.limit_in_bytes")
	if mem != fmt.Sprint(64<<20) {
		t.Errorf("memory limit = %q, want %d", mem, 64<<20)
	}
	ok(t, home, "session", "rm", "--force", id)
	if _, err := os.Stat(s.Cgroup); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still there after rm", s.Cgroup)
	}

	// A session without limits of its own still gets the default pids limit;
	// a fork bomb stops at its agent's.
	ok(t, home, "agent", "create", "forker", "--pids", "16", "--", "sh", "-c", "for i in $(seq 40); do sleep 5 & done; wait")
	r := run(t, home, "", "exec", "forker")
	if !strings.Contains(r.stderr, "Cannot fork") {
		t.Errorf("40 forks under pids 16: exit %d, stderr %q; want fork failures", r.code, r.stderr)
	}
}
