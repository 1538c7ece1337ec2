package protect

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// A third review: cases the newest code (commondir, mirrorNested, the
// writable-bind filter, leadsElsewhere, checkMountRoot) was not written
// around. Each test fails on the code it was written against.

// bindMount binds src onto dst in this process's namespace for the test.
func bindMount(t *testing.T, src, dst string) {
	t.Helper()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dst, unix.MNT_DETACH) })
}

// hasFinding reports whether the audit names path or a path beneath it.
func hasFinding(fs []Finding, path string) bool {
	for _, f := range fs {
		if f.Path == path || strings.HasPrefix(f.Path, path+"/") {
			return true
		}
	}
	return false
}

// mountinfo escapes only blank, tab, newline and backslash; readMounts
// splits its lines with strings.Fields, which also splits at \r, \v, \f,
// U+0085, U+00A0 (no-break space), U+3000 (ideographic space) and the
// other Unicode spaces. A root, or a directory holding a repository,
// whose name has one shifts the fields: every start fails its check
// inside ("Rel: can't make ... relative to b"). A runtime can leave such
// a repository in the workspace and stop every later start of its agent.
func TestReview2VerifyPathsWithUnicodeSpaces(t *testing.T) {
	for name, tc := range map[string]struct{ root, nested string }{
		"a root with an ideographic space":          {"プロジェクト\u3000A", ""},
		"a root with a no-break space":              {"my\u00a0project", ""},
		"a nested repository with a no-break space": {"ws", "x\u00a0y"},
		"a nested repository with a CR":             {"ws", "x\ry"},
		"a nested repository with a vertical tab":   {"ws", "x\vy"},
	} {
		t.Run(name, func(t *testing.T) {
			ws := filepath.Join(t.TempDir(), tc.root)
			if err := os.Mkdir(ws, 0o755); err != nil {
				t.Fatal(err)
			}
			git(t, ws, "init", "-q")
			if tc.nested != "" {
				os.Mkdir(filepath.Join(ws, tc.nested), 0o755)
				git(t, filepath.Join(ws, tc.nested), "init", "-q")
			}
			p, err := prepare(t, ws, false, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Release)
			if msg := runVerify(t, p); msg != "" {
				t.Errorf("Verify of an intact boundary: %s", msg)
			}
		})
	}
}

// handOver gives a root only the git directories other roots name by
// absolute paths outside themselves, and mirrorNested copies an inner
// root's binds into the outer one, never the other way. A .git file (or a
// commondir) in the outer root naming a git directory inside the inner
// one, where the inner walk does not look (node_modules, deeper than three
// levels), is protected at the outer root's target only: at the
// workspace's own target, and in the workspace share's virtiofsd (which
// premounts its own root's plan), its hooks are writable, and git in the
// outer root's worktree runs them.
func TestReview2OuterRootNamesAGitDirInTheInnerRoot(t *testing.T) {
	for name, plant := range map[string]func(t *testing.T, outer string){
		"a .git file": func(t *testing.T, outer string) {
			mustWrite(t, filepath.Join(outer, "other/.git"), "gitdir: ../proj/node_modules/gd\n")
		},
		"a commondir": func(t *testing.T, outer string) {
			mustWrite(t, filepath.Join(outer, "other/.git/HEAD"), "ref: refs/heads/main\n")
			mustWrite(t, filepath.Join(outer, "other/.git/commondir"), "../../proj/node_modules/gd\n")
		},
	} {
		t.Run(name, func(t *testing.T) {
			outer := t.TempDir()
			ws := filepath.Join(outer, "proj")
			os.Mkdir(ws, 0o755)
			git(t, ws, "init", "-q")
			bareRepo(t, filepath.Join(ws, "node_modules/gd"))
			plant(t, outer)
			gd := filepath.Join(ws, "node_modules/gd")
			if got := strings.TrimSpace(git(t, filepath.Join(outer, "other"), "rev-parse", "--path-format=absolute", "--git-common-dir")); got != gd {
				t.Fatalf("git in other uses %q", got)
			}
			p, err := Prepare(filepath.Join(t.TempDir(), "ledger.json"), []Root{
				{Host: ws, Dir: openDir(t, ws), Target: ws, Workspace: true},
				{Host: outer, Dir: openDir(t, outer), Target: "/mnt"},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Release)
			ro, _ := binds(p)
			if !ro["/mnt/proj/node_modules/gd/hooks"] {
				t.Fatalf("the outer root's own plan lacks proj/node_modules/gd/hooks")
			}
			if !ro[gd+"/hooks"] {
				t.Errorf("%s/hooks is not bound read-only at the workspace's target: writable there", gd)
			}
			if os.Geteuid() != 0 {
				return
			}
			// The workspace share's virtiofsd: its own plan, no other.
			err = inMountNS(t, func() error {
				if err := Premount(p.Roots[:1]); err != nil {
					return err
				}
				hook := filepath.Join(gd, "hooks/pre-commit")
				if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); !errors.Is(err, unix.EROFS) {
					t.Errorf("write %s in the workspace share's namespace: %v, want EROFS", hook, err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Renaming a directory above a mount is allowed (checkMountRoot's comment
// says so), and not only between the plan and the mounts: inside the
// boundary, the runtime renames the worktree of a nested repository, or
// .claude, and makes a new one in its place; the mounts go with the old
// directory, and the new sub/.git/hooks or .claude/commands is writable.
// (Tried in a real bwrap too: the same.) git on the host in sub runs the
// new hook; Claude Code reads the new command.
func TestReview2RenameAboveABindInsideTheBoundary(t *testing.T) {
	testutil.RequiresRoot(t)
	for name, tc := range map[string]struct{ dir, plant string }{
		"a nested repository's worktree": {"sub", "sub/.git/hooks/pre-commit"},
		".claude":                        {".claude", ".claude/commands/c.md"},
		"a git directory in node_modules, named by a .git file": {"node_modules/p", "node_modules/p/gd/hooks/pre-commit"},
	} {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			git(t, ws, "init", "-q")
			os.Mkdir(filepath.Join(ws, "sub"), 0o755)
			git(t, filepath.Join(ws, "sub"), "init", "-q")
			bareRepo(t, filepath.Join(ws, "node_modules/p/gd"))
			mustWrite(t, filepath.Join(ws, "wt/.git"), "gitdir: ../node_modules/p/gd\n")
			p, err := prepare(t, ws, false, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Release)
			err = inMountNS(t, func() error {
				if err := Premount(p.Roots); err != nil {
					return err
				}
				// What the runtime can do inside.
				if err := os.Rename(filepath.Join(ws, tc.dir), filepath.Join(ws, "moved")); err != nil {
					return nil // held
				}
				planted := filepath.Join(ws, tc.plant)
				if err := os.MkdirAll(filepath.Dir(planted), 0o755); err != nil {
					return nil
				}
				if err := os.WriteFile(planted, []byte("#!/bin/sh\n"), 0o755); err == nil {
					t.Errorf("renamed %s away inside the boundary and wrote %s", tc.dir, tc.plant)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Audit and Stale know the protected git directories by path: a
// repository made at the path of one (its worktree renamed away, out of
// the walk's reach, and made anew) is the one git on the host uses, and
// neither sees it.
func TestReview2RepositoryReplacedAtAProtectedPath(t *testing.T) {
	replace := func(t *testing.T, ws string) {
		t.Helper()
		os.MkdirAll(filepath.Join(ws, "node_modules"), 0o755)
		if err := os.Rename(filepath.Join(ws, "sub"), filepath.Join(ws, "node_modules/sub.old")); err != nil {
			t.Fatal(err)
		}
		os.Mkdir(filepath.Join(ws, "sub"), 0o755)
		git(t, filepath.Join(ws, "sub"), "init", "-q")
		mustWrite(t, filepath.Join(ws, "sub/.git/hooks/pre-commit"), "#!/bin/sh\n")
	}
	setup := func(t *testing.T) string {
		ws := t.TempDir()
		git(t, ws, "init", "-q")
		os.Mkdir(filepath.Join(ws, "sub"), 0o755)
		git(t, filepath.Join(ws, "sub"), "init", "-q")
		return ws
	}
	t.Run("audit", func(t *testing.T) {
		ws := setup(t)
		p, err := prepare(t, ws, false, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Release)
		replace(t, ws) // during the run (see TestReview2RenameAboveABindInsideTheBoundary)
		hook := filepath.Join(ws, "sub/.git/hooks/pre-commit")
		if fs := p.Audit(); !hasFinding(fs, hook) {
			t.Errorf("the audit %+v does not report %s, in a repository the run made", fs, hook)
		}
	})
	t.Run("stale", func(t *testing.T) {
		ws := setup(t)
		p := watched(t, ws)
		// By a concurrent session: a warm boundary's mount of sub/.git
		// went with the old directory.
		if stale, _ := staleAfter(t, p, func() { replace(t, ws) }); !stale {
			t.Error("Stale = false after sub's repository was replaced by a new one at the same path")
		}
	})
}

// git follows a symlinked commondir and a symlinked config; the scan's
// commondir branch skips a symlink ("its protection refuses it", true of
// a protected git directory only) and the audit reads config and
// commondir without following one. A repository the run made, whose
// commondir is a symlink to a file naming a directory the walk does not
// look at, or whose config is a symlink, has its hooks and settings
// reported nowhere.
func TestReview2AuditSymlinkedCommondirAndConfig(t *testing.T) {
	ws, p := repoPlan(t)
	// During the run.
	store := filepath.Join(ws, "store")
	bareRepo(t, store)
	mustWrite(t, filepath.Join(store, "hooks/pre-commit"), "#!/bin/sh\n")
	mustWrite(t, filepath.Join(ws, "cd.txt"), store+"\n")
	mustWrite(t, filepath.Join(ws, "a/.git/HEAD"), "ref: refs/heads/main\n")
	if err := os.Symlink("../../cd.txt", filepath.Join(ws, "a/.git/commondir")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(ws, "b"), 0o755)
	git(t, filepath.Join(ws, "b"), "init", "-q")
	mustWrite(t, filepath.Join(ws, "cfg.txt"), "[core]\n\tfsmonitor = touch /tmp/pwned\n")
	os.Remove(filepath.Join(ws, "b/.git/config"))
	if err := os.Symlink("../../cfg.txt", filepath.Join(ws, "b/.git/config")); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(git(t, filepath.Join(ws, "a"), "rev-parse", "--path-format=absolute", "--git-common-dir")); got != store {
		t.Fatalf("git in a uses %q", got)
	}
	if got := strings.TrimSpace(git(t, filepath.Join(ws, "b"), "config", "core.fsmonitor")); got != "touch /tmp/pwned" {
		t.Fatalf("git in b reads core.fsmonitor %q", got)
	}
	fs := p.Audit()
	if !hasFinding(fs, store) && !hasFinding(fs, filepath.Join(ws, "a/.git/commondir")) {
		t.Errorf("the audit %+v names neither %s/hooks/pre-commit, which git in a runs, nor a/.git/commondir", fs, store)
	}
	if !hasFinding(fs, filepath.Join(ws, "b/.git/config")) {
		t.Errorf("the audit %+v does not report b/.git/config (a symlink git reads: core.fsmonitor)", fs)
	}
}

// A root is matched to another, and a git directory to the root that
// holds it, by the path its fd resolves to. A directory has other paths
// on the host (a bind mount): an outer root holding the workspace
// through a bind mount shows it with none of its protected names, and a
// .git file naming the workspace's git directory by such a path leaves it
// to no root.
func TestReview2SameDirectoryByAnotherPath(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Run("a root inside another through a bind mount", func(t *testing.T) {
		outer, ws := t.TempDir(), t.TempDir()
		git(t, ws, "init", "-q")
		os.Mkdir(filepath.Join(outer, "proj"), 0o755)
		bindMount(t, ws, filepath.Join(outer, "proj"))
		p, err := Prepare(filepath.Join(t.TempDir(), "ledger.json"), []Root{
			{Host: ws, Dir: openDir(t, ws), Target: ws, Workspace: true},
			{Host: outer, Dir: openDir(t, outer), Target: "/mnt"},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Release)
		if ro, _ := binds(p); !ro["/mnt/proj/.vscode"] {
			t.Errorf("/mnt/proj/.vscode, the workspace's .vscode, is not bound read-only through the outer root")
		}
		// The outer share's virtiofsd.
		err = inMountNS(t, func() error {
			if err := Premount(p.Roots[1:]); err != nil {
				return err
			}
			f := filepath.Join(outer, "proj/.vscode/tasks.json")
			if err := os.WriteFile(f, nil, 0o644); !errors.Is(err, unix.EROFS) {
				t.Errorf("write %s in the outer share's namespace: %v, want EROFS", f, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a .git file naming a git directory by another path", func(t *testing.T) {
		ws, alias := t.TempDir(), t.TempDir()
		git(t, ws, "init", "-q")
		bareRepo(t, filepath.Join(ws, "node_modules/gd"))
		bindMount(t, ws, alias)
		mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: "+alias+"/node_modules/gd\n")
		if got := gitDirOf(t, filepath.Join(ws, "sub")); got != alias+"/node_modules/gd" {
			t.Fatalf("git in sub uses %q", got)
		}
		p, err := prepare(t, ws, false, true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Release)
		if ro, _ := binds(p); !ro[ws+"/node_modules/gd/hooks"] {
			t.Errorf("node_modules/gd/hooks, which git in sub runs, is not bound read-only; GitDirs %q", p.GitDirs)
		}
	})
}
