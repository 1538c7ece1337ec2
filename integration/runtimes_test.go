package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRuntimeCache: runtime install puts the real claude-agent-acp from npm
// in the daemon's cache, in a tree named by its lock's digest; ls shows it
// with its command; install again changes nothing; update keeps the same
// tree for the same lock; an unknown runtime is refused with the known ones.
func TestRuntimeCache(t *testing.T) {
	requireNPM(t)
	home := newHome(t)
	startDaemon(t, home)
	var installed struct {
		Name, Version, Digest, Dir string
		Installed                  bool
		Command                    []string
	}
	if err := json.Unmarshal([]byte(ok(t, home, "runtime", "install", "claude", "--json")), &installed); err != nil {
		t.Fatal(err)
	}
	if !installed.Installed || len(installed.Digest) != 64 || installed.Dir != filepath.Join(home, "runtimes", "store", "sha256-"+installed.Digest) {
		t.Fatalf("runtime install: %+v", installed)
	}
	if len(installed.Command) == 0 {
		t.Fatal("no command")
	}
	if _, err := os.Stat(installed.Command[0]); err != nil {
		t.Errorf("the runtime's command: %v", err)
	}
	ls := ok(t, home, "runtime", "ls")
	for _, want := range []string{"claude", "@zed-industries/claude-agent-acp", installed.Digest[:12], "codex", "no"} {
		if !strings.Contains(ls, want) {
			t.Errorf("runtime ls lacks %q:\n%s", want, ls)
		}
	}
	again := ok(t, home, "runtime", "install", "claude")
	updated := ok(t, home, "runtime", "update", "claude")
	for _, out := range []string{again, updated} {
		if !strings.Contains(out, installed.Dir) {
			t.Errorf("install again / update: %s, want the same tree %s", out, installed.Dir)
		}
	}
	if r := run(t, home, "", "runtime", "install", "nope"); r.code == 0 || !strings.Contains(r.stderr, "claude, codex, gemini, opencode") {
		t.Errorf("an unknown runtime: %+v", r)
	}
	if left, _ := filepath.Glob(filepath.Join(home, "runtimes", ".install-*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// requireNPM skips a test that installs runtimes where npm is missing.
func requireNPM(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("npm is not installed (make deps installs it)")
	}
}

// TestAgentWithARuntime: agent create --runtime installs the known runtime
// into the cache and runs it from there: the agent records the runtime and
// its extra arguments, not a command; its API hosts are allowed; a session
// runs the tree's command read-only inside srt and answers initialize. An
// unknown runtime, or a runtime with a command, is refused and creates
// nothing.
func TestAgentWithARuntime(t *testing.T) {
	requireNPM(t)
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	withCommand := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(withCommand, []byte(`{"name": "bad", "runtime": "claude", "command": ["x"]}`), 0o644)
	for _, args := range [][]string{
		{"agent", "create", "bad", "--runtime", "nope"},
		{"agent", "create", "--from-file", withCommand},
	} {
		if r := run(t, home, "", args...); r.code == 0 || !strings.Contains(r.stderr, "runtime") {
			t.Errorf("%v: %+v", args, r)
		}
	}
	if out := ok(t, home, "agent", "ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Errorf("a refused agent was made: %s", out)
	}
	if _, err := os.Stat(filepath.Join(home, "runtimes", "claude.json")); err == nil {
		t.Error("a refused agent installed its runtime")
	}
	ok(t, home, "agent", "create", "c", "--strategy", "srt", "--runtime", "claude", "--", "--some-flag")
	var a struct {
		Command, RuntimeArgs, AllowedDomains []string
		Runtime                              string
	}
	if err := json.Unmarshal([]byte(ok(t, home, "agent", "show", "c", "--json")), &a); err != nil {
		t.Fatal(err)
	}
	if a.Runtime != "claude" || len(a.Command) != 0 || strings.Join(a.RuntimeArgs, " ") != "--some-flag" ||
		!slices.Contains(a.AllowedDomains, "api.anthropic.com") {
		t.Errorf("agent show: %+v", a)
	}
	// The session's command is the tree's, at the path srt shows it, with
	// the extra flag after it (claude-agent-acp ignores one it does not
	// know).
	id := strings.TrimSpace(ok(t, home, "session", "start", "c"))
	var sess struct{ Command []string }
	json.Unmarshal([]byte(ok(t, home, "session", "show", id, "--json")), &sess)
	if want := "/opt/agentconnect/runtimes/claude/node_modules/.bin/claude-agent-acp --some-flag"; strings.Join(sess.Command, " ") != want {
		t.Errorf("the session's command: %v", sess.Command)
	}
	ok(t, home, "session", "stop", id)
	r := run(t, home, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}`+"\n", "exec", "c")
	if r.code != 0 || !strings.Contains(r.stdout, `claude-agent-acp"`) {
		t.Errorf("initialize through exec: %+v", r)
	}
}
