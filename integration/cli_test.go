package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestRecoveryWithWedgedAndMissingShims(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--", "sleep", "600")
	wedged := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	missing := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	w, m := show(t, home, wedged), show(t, home, missing)

	d.kill9()
	syscall.Kill(w.ShimPID, syscall.SIGSTOP)
	defer syscall.Kill(w.ShimPID, syscall.SIGCONT)
	syscall.Kill(m.ShimPID, syscall.SIGKILL)

	start := time.Now()
	d.restart()
	t.Logf("the daemon answered %v after its start, with one shim stopped", time.Since(start).Round(time.Millisecond))
	if s := show(t, home, missing); s.State != "lost" || s.Reason == "" {
		t.Errorf("session with a missing shim: %+v, want lost with a reason", s)
	}
	s := show(t, home, wedged)
	if s.State != "running" || !strings.Contains(s.Reason, "not answering") {
		t.Errorf("session with a stopped shim: %+v, want running, its shim not answering", s)
	}
	// Once the shim answers again it is adopted.
	syscall.Kill(w.ShimPID, syscall.SIGCONT)
	eventually(t, 10*time.Second, "the woken shim is adopted", func() bool {
		s := show(t, home, wedged)
		return s.State == "running" && s.Reason == "" && s.PID == w.PID
	})
	ok(t, home, "session", "stop", wedged)
	if s := show(t, home, wedged); s.State != "exited" {
		t.Errorf("after stop: %+v", s)
	}
}

func TestAgentFromFileEditRemove(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	file := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(file, []byte(`{"name": "filed", "command": ["sh", "-c", "echo $GREETING"], "env": ["GREETING=hello"]}`), 0o600)
	ok(t, home, "agent", "create", "--from-file", file)
	if r := run(t, home, "", "exec", "filed"); r.stdout != "hello\n" {
		t.Fatalf("exec of an agent from a file: %+v", r)
	}
	ok(t, home, "agent", "edit", "filed", "--env", "GREETING=bye", "--name", "renamed")
	if r := run(t, home, "", "exec", "renamed"); r.stdout != "bye\n" {
		t.Errorf("exec after edit: %+v", r)
	}
	var a struct {
		Name string   `json:"name"`
		Env  []string `json:"env"`
	}
	okJSON(t, home, &a, "agent", "show", "renamed")
	if a.Name != "renamed" || len(a.Env) != 1 || a.Env[0] != "GREETING=bye" {
		t.Errorf("agent show: %+v", a)
	}
	os.WriteFile(file, []byte(`{"name": "x", "commnad": ["true"]}`), 0o600)
	if r := run(t, home, "", "agent", "create", "--from-file", file); r.code == 0 || !strings.Contains(r.stderr, "commnad") {
		t.Errorf("a file with an unknown key: %+v", r)
	}
	id := strings.TrimSpace(ok(t, home, "session", "start", "renamed", "--", "sleep", "600"))
	if r := run(t, home, "", "agent", "rm", "renamed"); r.code == 0 || !strings.Contains(r.stderr, "running") {
		t.Errorf("rm of an agent with a running session: %+v", r)
	}
	ok(t, home, "session", "stop", "--timeout", "1", id)
	ok(t, home, "agent", "rm", "renamed")
	if entries, _ := os.ReadDir(filepath.Join(home, "agents")); len(entries) != 0 {
		t.Errorf("agents/ holds %d entries after rm", len(entries))
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "sessions")); len(entries) != 0 {
		t.Errorf("sessions/ holds %d entries after the agent's rm", len(entries))
	}
}

func TestEventsAndListings(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "hi", "--", "sh", "-c", "echo hi; exit 2")
	r := run(t, home, "", "exec", "hi")
	if r.code != 2 || r.stdout != "hi\n" {
		t.Fatalf("exec: %+v, want exit 2", r)
	}
	out := ok(t, home, "events", "--json")
	var types []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e struct {
			Type     string `json:"type"`
			ExitCode int    `json:"exitCode"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		types = append(types, e.Type)
	}
	got := strings.Join(types, " ")
	for _, want := range []string{"daemon.started", "agent.created", "session.started", "session.exited", "session.removed"} {
		if !strings.Contains(got, want) {
			t.Errorf("events %q lack %s", got, want)
		}
	}
	// Listings: JSON lists, never null, zero values present.
	for _, args := range [][]string{{"session", "ls"}, {"agent", "ls"}} {
		out := ok(t, home, append(args, "--json")...)
		if !strings.HasPrefix(strings.TrimSpace(out), "[") {
			t.Errorf("%v --json = %q, want a list", args, out)
		}
	}
	id := strings.TrimSpace(ok(t, home, "session", "start", "hi"))
	ok(t, home, "session", "wait", id)
	var raw map[string]any
	okJSON(t, home, &raw, "session", "show", id)
	for _, key := range []string{"id", "agent", "strategy", "state", "pid", "exitCode", "reason", "outputBytes"} {
		if _, found := raw[key]; !found {
			t.Errorf("session show --json lacks %q: %v", key, raw)
		}
	}
	if v, isNumber := raw["exitCode"].(float64); !isNumber || v != 2 {
		t.Errorf("exitCode = %#v, want the number 2", raw["exitCode"])
	}
}
