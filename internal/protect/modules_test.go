package protect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// submoduleGitDir makes a submodule named name (git names it after its
// path, slashes included) in the repository ws, and removes its worktree:
// the git directory stays in .git/modules/<name>, where
// `git submodule update` finds it and runs its hooks.
func submoduleGitDir(t *testing.T, ws, name string) string {
	t.Helper()
	src := t.TempDir()
	git(t, src, "init", "-q")
	git(t, src, "commit", "-q", "--allow-empty", "-m", "x")
	git(t, ws, "-c", "protocol.file.allow=always", "submodule", "add", "-q", src, name)
	if err := os.RemoveAll(filepath.Join(ws, name)); err != nil {
		t.Fatal(err)
	}
	g := filepath.Join(ws, ".git/modules", name)
	if _, err := os.Stat(filepath.Join(g, "HEAD")); err != nil {
		t.Fatalf("git did not make the submodule's git directory at %s: %v", g, err)
	}
	return g
}

// plantHook makes a git directory at rel in ws as a runtime would (git
// init --bare), with the hook name in it, and returns the hook's path.
func plantHook(t *testing.T, ws, rel, name string) string {
	t.Helper()
	g := filepath.Join(ws, rel)
	git(t, ws, "init", "-q", "--bare", g)
	hook := filepath.Join(g, "hooks", name)
	mustWrite(t, hook, "#!/bin/sh\n")
	return hook
}

// wantLibsFooProtected checks that the git directory of a submodule named
// libs/foo (not checked out) is protected, or the start refused, once
// plant has made what (say "holds an empty hooks") in .git/modules/libs.
func wantLibsFooProtected(t *testing.T, plant func(t *testing.T, dir string), what string) {
	t.Helper()
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	g := submoduleGitDir(t, ws, "libs/foo")
	plant(t, filepath.Join(ws, ".git/modules/libs"))
	p, err := prepare(t, ws, false, true)
	if err != nil {
		return // refused: fail-closed is fine
	}
	defer p.Release()
	ro, _ := binds(p)
	for _, part := range []string{"hooks", "config"} {
		if !ro[filepath.Join(g, part)] {
			t.Errorf("%s is not bound read-only once .git/modules/libs %s", filepath.Join(g, part), what)
		}
	}
}

// wantLibsFooAudited checks that a run's end reports the hook name it
// planted in .git/modules/libs/foo beside what plant made in libs.
func wantLibsFooAudited(t *testing.T, plant func(t *testing.T, dir string), name, what string) {
	t.Helper()
	ws, p := repoPlan(t)
	hook := plantHook(t, ws, ".git/modules/libs/foo", name)
	plant(t, filepath.Join(ws, ".git/modules/libs"))
	if found := p.Audit(); !hasFinding(found, hook) {
		t.Errorf("the audit did not report %s with .git/modules/libs %s; it found %v", hook, what, found)
	}
}

// A submodule whose name has a slash (libs/foo, the default for a
// submodule at that path) has its git directory two levels beneath
// modules/: the scan must find it there, not take libs for a git directory.
func TestSubmoduleNamedWithASlashIsProtected(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	g := submoduleGitDir(t, ws, "libs/foo")
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	ro, _ := binds(p)
	for _, name := range []string{"hooks", "config"} {
		if !ro[filepath.Join(g, name)] {
			t.Errorf("%s is not bound read-only", filepath.Join(g, name))
		}
	}
	if ro[filepath.Join(ws, ".git/modules/libs/hooks")] {
		t.Errorf("libs, a part of the name, was taken for a git directory")
	}
	if _, err := os.Lstat(filepath.Join(ws, ".git/modules/libs/hooks")); err == nil {
		t.Errorf("a placeholder was made in .git/modules/libs, which is not a git directory")
	}
}

// One made during a run, at a name with slashes, is reported at its end.
func TestAuditFindsASubmoduleNamedWithASlash(t *testing.T) {
	ws, p := repoPlan(t)
	// As a runtime would plant one (.gitmodules is read-only for it).
	hook := plantHook(t, ws, ".git/modules/third_party/a/b", "post-checkout")
	var found []string
	for _, f := range p.Audit() {
		found = append(found, f.Path+": "+f.Reason)
	}
	if !strings.Contains(strings.Join(found, "\n"), hook) {
		t.Errorf("the audit did not report %s; it found:\n%s", hook, strings.Join(found, "\n"))
	}
}

// Names nested past the bound fail the scan instead of leaving a git
// directory unseen.
func TestSubmoduleNamesDeeperThanTheBoundFail(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	deep := filepath.Join(append([]string{ws, ".git/modules"}, strings.Split(strings.Repeat("d/", maxModuleNameDepth+1), "/")...)...)
	if err := os.MkdirAll(filepath.Join(deep, "hooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(deep, "HEAD"), "ref: refs/heads/main\n")
	p, err := prepare(t, ws, false, true)
	if err == nil {
		p.Release()
		t.Fatalf("prepared a workspace with a git directory %d names deep in .git/modules", maxModuleNameDepth+1)
	}
	if !strings.Contains(err.Error(), ".git/modules") {
		t.Errorf("error %q does not name .git/modules", err)
	}
}

// A warm boundary's watch sees a git directory made in a directory of a
// submodule's name that was there, empty, when the boundary was built.
func TestWatchSeesASubmoduleGitDirInAPartOfItsName(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	if err := os.MkdirAll(filepath.Join(ws, ".git/modules/libs/foo"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := watched(t, ws)
	stale, scanned := staleAfter(t, p, func() {
		mustWrite(t, filepath.Join(ws, ".git/modules/libs/foo/HEAD"), "ref: refs/heads/main\n")
	})
	if !stale || !scanned {
		t.Errorf("stale %v, scanned %v; want both", stale, scanned)
	}
}
