package protect

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// gitDirOf is the git directory git itself uses in dir.
func gitDirOf(t *testing.T, dir string) string {
	t.Helper()
	return strings.TrimSuffix(git(t, dir, "rev-parse", "--absolute-git-dir"), "\n")
}

// bareRepo makes a bare repository at path (any name: git does not care).
func bareRepo(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, filepath.Dir(path), "init", "-q", "--bare", filepath.Base(path))
}

// lastBindReadOnly reports, for every target bound read-only at least once,
// whether the last bind there (the one on top, in bwrap's order) is
// read-only.
func lastBindReadOnly(p *Plan) (everRO, lastRO map[string]bool) {
	everRO, lastRO = map[string]bool{}, map[string]bool{}
	for _, r := range p.Roots {
		for _, b := range r.Binds {
			if b.ReadOnly {
				everRO[b.Target] = true
			}
			lastRO[b.Target] = b.ReadOnly
		}
	}
	return everRO, lastRO
}

// git reads the whole .git file, strips only trailing CR/LF, and takes
// everything after "gitdir: " as the path: trailing blanks and later lines
// are part of it. The scan took the first line, TrimSpace'd, so it protected
// a decoy while git used (and ran the hooks of) another directory.
func TestReviewGitFilePathAsGitReadsIt(t *testing.T) {
	for name, tc := range map[string]struct{ content, real string }{
		"trailing space": {"gitdir: ../real \n", "real "},
		"trailing tab":   {"gitdir: ../real\t\n", "real\t"},
		"second line":    {"gitdir: ../real\nX\n", "real\nX"},
	} {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			git(t, ws, "init", "-q")
			os.Mkdir(filepath.Join(ws, "real"), 0o755) // the decoy the scan follows
			bareRepo(t, filepath.Join(ws, tc.real))
			mustWrite(t, filepath.Join(ws, "sub/.git"), tc.content)
			real := filepath.Join(ws, tc.real)
			if got := gitDirOf(t, filepath.Join(ws, "sub")); got != real {
				t.Fatalf("git uses %q, the test expects %q", got, real)
			}
			p, err := prepare(t, ws, false, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Release)
			ro, _ := binds(p)
			if !ro[filepath.Join(real, "hooks")] || !ro[filepath.Join(real, "config")] {
				t.Errorf("the git directory git uses, %q, has no read-only hooks/config; GitDirs %q", real, p.GitDirs)
			}
		})
	}
}

// "gitdir: /proc/self/cwd/../gd" is resolved by git against its own cwd (the
// worktree), by the scan against the daemon's: the scan dropped it as a
// path outside every root, and ws/gd, which git uses, stayed writable.
func TestReviewGitFileThroughProcSelf(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	bareRepo(t, filepath.Join(ws, "gd"))
	mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: /proc/self/cwd/../gd\n")
	if got := gitDirOf(t, filepath.Join(ws, "sub")); got != filepath.Join(ws, "gd") {
		t.Fatalf("git uses %q", got)
	}
	// Refused: the path leads elsewhere for git than here.
	p, err := prepare(t, ws, false, true)
	if err == nil {
		p.Release()
		t.Fatalf("Prepare protected %q; want the .git file through /proc refused", p.GitDirs)
	}
	if !strings.Contains(err.Error(), "magic link") || !strings.Contains(err.Error(), filepath.Join(ws, "sub/.git")) {
		t.Errorf("Prepare: %v; want it to name sub/.git and the magic link", err)
	}
}

// A git directory's commondir moves its config and hooks: the plan makes
// commondir read-only but does not protect the directory it names, where
// git reads the config and runs the hooks.
func TestReviewCommondirTargetProtected(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	bareRepo(t, filepath.Join(ws, "store"))
	mustWrite(t, filepath.Join(ws, "gd/HEAD"), "ref: refs/heads/main\n")
	mustWrite(t, filepath.Join(ws, "gd/commondir"), "../store\n")
	mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: ../gd\n")
	common := strings.TrimSpace(git(t, filepath.Join(ws, "sub"), "rev-parse", "--path-format=absolute", "--git-common-dir"))
	if common != filepath.Join(ws, "store") {
		t.Fatalf("git's common dir is %q", common)
	}
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	ro, _ := binds(p)
	for _, n := range []string{"store/hooks", "store/config"} {
		if !ro[filepath.Join(ws, n)] {
			t.Errorf("%s, which git in sub uses (commondir), is not bound read-only", n)
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	err = inMountNS(t, func() error {
		if err := Premount(p.Roots); err != nil {
			return err
		}
		hook := filepath.Join(ws, "store/hooks/pre-commit")
		if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); !errors.Is(err, unix.EROFS) {
			t.Errorf("write %s in the namespace: %v, want EROFS", hook, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// "gitdir: ../.git/hooks" makes .git/hooks a git directory: its writable
// bind has the same depth as the read-only bind of .git/hooks and comes
// after it, so it lands on top. beneathProtected knows only the root's
// protected names, not a git directory's.
func TestReviewGitDirAtAGitDirsProtectedPart(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: ../.git/hooks\n")
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	everRO, lastRO := lastBindReadOnly(p)
	for target := range everRO {
		if !lastRO[target] {
			t.Errorf("%s is bound read-only, then writable on top of it", target)
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	err = inMountNS(t, func() error {
		if err := Premount(p.Roots); err != nil {
			return err
		}
		hook := filepath.Join(ws, ".git/hooks/pre-commit")
		if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); !errors.Is(err, unix.EROFS) {
			t.Errorf("write %s in the namespace: %v, want EROFS", hook, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A .git file's path through a symlink is resolved at the scan; pointing
// the symlink elsewhere afterwards is an event of a non-directory, which
// the watch lets pass, and the .git file reads the same: Stale says "not
// stale" while a scan finds a git directory the plan does not protect.
func TestReviewWatchSeesASymlinkOnAGitFilesWay(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	for _, d := range []string{"s1/gd", "s2/gd"} {
		os.MkdirAll(filepath.Join(ws, d), 0o755)
	}
	os.Mkdir(filepath.Join(ws, "wt"), 0o755)
	if err := os.Symlink("../s1", filepath.Join(ws, "wt/l")); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(ws, "wt/.git"), "gitdir: l/gd\n")
	p := watched(t, ws)
	stale, _ := staleAfter(t, p, func() {
		os.Symlink("../s2", filepath.Join(ws, "wt/l.new"))
		os.Rename(filepath.Join(ws, "wt/l.new"), filepath.Join(ws, "wt/l"))
	})
	after, err := findGitDirs(p.roots[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(after, "s2/gd") {
		t.Fatalf("a scan finds %q, without s2/gd", after)
	}
	if !stale {
		t.Errorf("Stale = false; a scan finds %q, the plan protects %q", after, p.GitDirs)
	}
}

// A root inside another (a rw mount of the shared workspace's parent, as
// TestPrepareRootHoldingANewRepository has it) shows the workspace a second
// time, at the outer root's target. What only the inner root's plan
// protects is writable there: in a VM each share's virtiofsd premounts its
// own RootPlan only (runner.go), and bwrap without the premount binds each
// root's names at that root's target only.
func TestReviewInnerRootProtectedThroughOuterRoot(t *testing.T) {
	for name, tc := range map[string]struct {
		setup func(t *testing.T, ws string)
		rel   string // beneath the workspace, must be read-only through the outer root
	}{
		"a repository three levels down the workspace": {
			func(t *testing.T, ws string) {
				os.MkdirAll(filepath.Join(ws, "a/b/c"), 0o755)
				git(t, filepath.Join(ws, "a/b/c"), "init", "-q")
			}, "a/b/c/.git/hooks",
		},
		"the workspace's .vscode": {func(t *testing.T, ws string) {}, ".vscode"},
	} {
		t.Run(name, func(t *testing.T) {
			outer := t.TempDir()
			ws := filepath.Join(outer, "proj")
			os.Mkdir(ws, 0o755)
			git(t, ws, "init", "-q")
			tc.setup(t, ws)
			p, err := Prepare(filepath.Join(t.TempDir(), "ledger.json"), []Root{
				{Host: outer, Dir: openDir(t, outer), Target: "/mnt"},
				{Host: ws, Dir: openDir(t, ws), Target: ws, Workspace: true},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Release)
			ro, _ := binds(p)
			if !ro[ws+"/"+tc.rel] {
				t.Fatalf("the workspace's own plan lacks %s", tc.rel)
			}
			if !ro["/mnt/proj/"+tc.rel] {
				t.Errorf("/mnt/proj/%s is not bound read-only: the workspace's %s is writable through the outer root", tc.rel, tc.rel)
			}
			if os.Geteuid() != 0 {
				return
			}
			// The outer share's virtiofsd: its own plan premounted, no other.
			err = inMountNS(t, func() error {
				if err := Premount(p.Roots[:1]); err != nil {
					return err
				}
				f := filepath.Join(outer, "proj", tc.rel, "planted")
				if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); !errors.Is(err, unix.EROFS) {
					t.Errorf("write %s in the outer share's namespace: %v, want EROFS", f, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// bwrap binds a git directory from its fd at its path: if the directory's
// parent was renamed between Prepare and the mounts (by a concurrent
// session: renaming an ancestor of a mount point is allowed) and a new one
// made, the bind shows the old git directory at the new path, every
// identity check passed, and the real git directory sat unprotected at
// the parent's new name. Verify notices: the bind's mount root is not
// the path its parent shows.
func TestReviewVerifyCatchesAParentRenamedBeforeTheMounts(t *testing.T) {
	testutil.RequiresRoot(t)
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	os.Mkdir(filepath.Join(ws, "sub"), 0o755)
	git(t, filepath.Join(ws, "sub"), "init", "-q")
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	if err := os.Rename(filepath.Join(ws, "sub"), filepath.Join(ws, "sub.old")); err != nil {
		t.Fatal(err)
	}
	git(t, ws, "init", "-q", "sub")
	if msg := runVerify(t, p); msg == "" {
		t.Error("Verify passed while sub/.git (bound from the old inode) hides the new one and the real git directory is at sub.old/.git, unprotected")
	}
}
