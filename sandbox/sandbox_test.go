package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// argsHave reports whether args hold the sequence want.
func argsHave(args []string, want ...string) bool {
	for i := 0; i+len(want) <= len(args); i++ {
		match := true
		for j, w := range want {
			if args[i+j] != w {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

func gitInit(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("git", "init", "-q", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("git init: %v: %s", err, out)
	}
}

func TestProtectWorkspace(t *testing.T) {
	ws := t.TempDir()
	gitInit(t, ws)
	gitInit(t, filepath.Join(ws, "sub", "nested"))
	os.Mkdir(filepath.Join(ws, ".vscode"), 0o700)
	os.WriteFile(filepath.Join(ws, ".gitmodules"), nil, 0o600)
	b := &builder{emptyFile: "/run/empty", emptyDir: "/run/empty.d"}
	if err := b.protect(ws, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range [][]string{
		{"--bind", ws + "/.git", ws + "/.git"}, // a mount point: it cannot be renamed away
		{"--ro-bind", ws + "/.git/hooks", ws + "/.git/hooks"},
		{"--ro-bind", ws + "/.git/config", ws + "/.git/config"},
		{"--bind", ws + "/sub/nested/.git", ws + "/sub/nested/.git"},
		{"--ro-bind", ws + "/sub/nested/.git/config", ws + "/sub/nested/.git/config"},
		{"--ro-bind", ws + "/.vscode", ws + "/.vscode"},
		{"--ro-bind", ws + "/.gitmodules", ws + "/.gitmodules"},
		// Absent names get placeholder directories in a workspace: git
		// ignores them, so the repository's status does not change.
		{"--ro-bind", "/run/empty.d", ws + "/.mcp.json"},
		{"--ro-bind", "/run/empty.d", ws + "/.bashrc"},
		{"--ro-bind", "/run/empty.d", ws + "/.claude/commands"},
	} {
		if !argsHave(b.args, want...) {
			t.Errorf("args lack %q", want)
		}
	}
	// The .git bind comes before the read-only binds inside it, or it would
	// cover them.
	gitBind, hooks := -1, -1
	for i, a := range b.args {
		if a == ws+"/.git" && gitBind < 0 {
			gitBind = i
		}
		if a == ws+"/.git/hooks" && hooks < 0 {
			hooks = i
		}
	}
	if gitBind > hooks {
		t.Error("the .git bind comes after the read-only binds inside it")
	}
	// Placeholders, parents first made included, are removed after the run.
	for _, p := range []string{ws + "/.mcp.json", ws + "/.claude", ws + "/.claude/commands"} {
		found := false
		for _, q := range b.placeholders {
			found = found || q == p
		}
		if !found {
			t.Errorf("placeholders %q lack %s", b.placeholders, p)
		}
	}
}

func TestProtectHomeUsesFiles(t *testing.T) {
	home := t.TempDir()
	b := &builder{emptyFile: "/run/empty", emptyDir: "/run/empty.d"}
	if err := b.protect(home, true); err != nil {
		t.Fatal(err)
	}
	// Shells source rc files from the home: an absent one is an empty file.
	if !argsHave(b.args, "--ro-bind", "/run/empty", home+"/.bashrc") {
		t.Errorf("home .bashrc placeholder is not /dev/null: %q", b.args)
	}
	if !argsHave(b.args, "--ro-bind", "/run/empty.d", home+"/.vscode") {
		t.Error("home .vscode placeholder is not an empty read-only directory")
	}
}

func TestProtectRefusesSymlinks(t *testing.T) {
	ws := t.TempDir()
	os.Symlink("/etc/hostname", filepath.Join(ws, ".bashrc"))
	b := &builder{}
	err := b.protect(ws, false)
	if err == nil || !strings.Contains(err.Error(), "is a symlink") {
		t.Errorf("protect with a symlinked .bashrc = %v, want a refusal", err)
	}
}

func TestProtectRefusesSymlinkedParents(t *testing.T) {
	ws := t.TempDir()
	elsewhere := t.TempDir()
	os.Symlink(elsewhere, filepath.Join(ws, ".claude"))
	b := &builder{}
	err := b.protect(ws, false)
	if err == nil || !strings.Contains(err.Error(), ".claude is a symlink") {
		t.Errorf("protect with a symlinked .claude = %v, want a refusal", err)
	}
}

func TestFindGitDirsFollowsGitFiles(t *testing.T) {
	ws := t.TempDir()
	gitInit(t, filepath.Join(ws, "main"))
	// A worktree-style .git file pointing to a git dir inside the root, and
	// one pointing outside it (not ours to protect).
	os.MkdirAll(filepath.Join(ws, "main/.git/worktrees/wt"), 0o700)
	os.MkdirAll(filepath.Join(ws, "wt"), 0o700)
	os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: ../main/.git/worktrees/wt\n"), 0o600)
	os.MkdirAll(filepath.Join(ws, "other"), 0o700)
	os.WriteFile(filepath.Join(ws, "other/.git"), []byte("gitdir: /elsewhere/.git\n"), 0o600)
	got, err := findGitDirs(ws)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{ws + "/main/.git": true, ws + "/main/.git/worktrees/wt": true}
	for _, g := range got {
		if !want[g] {
			t.Errorf("found %s, outside what was expected", g)
		}
		delete(want, g)
	}
	for g := range want {
		t.Errorf("did not find %s", g)
	}
}

func TestOpenBeneathRefusesSymlinks(t *testing.T) {
	agent := t.TempDir()
	outside := t.TempDir()
	os.Mkdir(filepath.Join(agent, "workspace"), 0o700)
	os.Symlink(outside, filepath.Join(agent, "home"))
	f, err := openBeneath(agent, filepath.Join(agent, "workspace"))
	if err != nil {
		t.Fatalf("openBeneath(workspace) = %v", err)
	}
	f.Close()
	if _, err := openBeneath(agent, filepath.Join(agent, "home")); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("openBeneath through a symlink = %v, want a refusal naming the symlink", err)
	}
	if _, err := openBeneath(agent, outside); err == nil {
		t.Error("openBeneath of a path outside the root succeeded")
	}
}

func TestMakeRoomSplitsReadOnlyParent(t *testing.T) {
	b := &builder{}
	// /usr/share exists on the host; /usr/share/agentconnect-test-tools does
	// not: /usr/share becomes a tmpfs holding its entries again.
	target := "/usr/share/agentconnect-test-tools/bin"
	if err := b.makeRoom(target, Config{}); err != nil {
		t.Fatal(err)
	}
	if !argsHave(b.args, "--tmpfs", "/usr/share") || len(b.readOnlyLater) != 1 || b.readOnlyLater[0] != "/usr/share" {
		t.Fatalf("args %q (read-only later: %q) do not split /usr/share", b.args, b.readOnlyLater)
	}
	entries, _ := os.ReadDir("/usr/share")
	if len(entries) > 0 {
		p := "/usr/share/" + entries[0].Name()
		if !argsHave(b.args, "--ro-bind", p, p) && !argsHave(b.args, p) {
			t.Errorf("args do not bind %s back", p)
		}
	}
	// An existing target needs no room; one under /tmp has a tmpfs already.
	b = &builder{}
	b.makeRoom("/usr", Config{})
	b.makeRoom("/tmp/x/y", Config{})
	if len(b.args) != 0 {
		t.Errorf("args %q, want none", b.args)
	}
}
