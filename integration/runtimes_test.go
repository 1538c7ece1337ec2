package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRuntimeCache: runtime install puts the real claude-agent-acp from npm
// in the daemon's cache, in a tree named by its lock's digest; ls shows it
// with its command; install again changes nothing; update keeps the same
// tree for the same lock; an unknown runtime is refused with the known ones.
func TestRuntimeCache(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("npm is not installed (make deps installs it)")
	}
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
