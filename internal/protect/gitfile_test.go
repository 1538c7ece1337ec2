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

// twoRoots is a workspace holding a repository and a home beside it, both
// writable roots of one boundary, seen at their own paths; setup runs
// before the plan is made.
func twoRoots(t *testing.T, setup func(ws, home string)) (ws, home string, p *Plan) {
	t.Helper()
	base := t.TempDir()
	ws, home = filepath.Join(base, "ws"), filepath.Join(base, "home")
	for _, d := range []string{ws, home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	git(t, ws, "init", "-q")
	setup(ws, home)
	p, err := Prepare(filepath.Join(base, "ledger.json"), []Root{
		{Host: ws, Dir: openDir(t, ws), Target: ws, Workspace: true},
		{Host: home, Dir: openDir(t, home), Target: home, Home: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	return ws, home, p
}

// mustWrite writes a file the test's setup needs.
func mustWrite(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A .git file in the workspace may name a git directory in home, where
// home's own walk does not look (under node_modules): git on the host
// follows it there, so the root that holds it protects it, whether the
// path is absolute or leads there by "..".
func TestGitFileIntoAnotherRoot(t *testing.T) {
	for name, gitdir := range map[string]func(home string) string{
		"absolute": func(home string) string { return home + "/node_modules/p/r.git" },
		"relative": func(string) string { return "../../home/node_modules/p/r.git" },
	} {
		t.Run(name, func(t *testing.T) {
			_, home, p := twoRoots(t, func(ws, home string) {
				os.MkdirAll(filepath.Join(home, "node_modules/p/r.git"), 0o755)
				mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: "+gitdir(home)+"\n")
			})
			g := filepath.Join(home, "node_modules/p/r.git")
			if !slices.Contains(p.GitDirs, g) {
				t.Fatalf("git directories %q lack %s", p.GitDirs, g)
			}
			ro, _ := binds(p)
			if readOnly, ok := ro[filepath.Join(g, "hooks")]; !ok || !readOnly {
				t.Errorf("%s/hooks is not bound read-only: %v", g, ro)
			}
			if stale, err := p.Stale(); err != nil || stale {
				t.Errorf("Stale = %v, %v right after Prepare; want false", stale, err)
			}
		})
	}
}

// In a namespace with the plan's mounts, the hooks of a git directory a
// .git file of another root names cannot be written.
func TestGitFileIntoAnotherRootPremounted(t *testing.T) {
	testutil.RequiresRoot(t)
	_, home, p := twoRoots(t, func(ws, home string) {
		os.MkdirAll(filepath.Join(home, "node_modules/p/r.git"), 0o755)
		mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: "+home+"/node_modules/p/r.git\n")
	})
	err := inMountNS(t, func() error {
		if err := Premount(p.Roots); err != nil {
			return err
		}
		hook := filepath.Join(home, "node_modules/p/r.git/hooks/pre-commit")
		if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); !errors.Is(err, unix.EROFS) {
			t.Errorf("write %s in the namespace: %v, want EROFS", hook, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The watch follows the way to a git directory in another root, and the
// claim's check and the end audit follow .git files into other roots too.
func TestGitFileIntoAnotherRootWatchedAndAudited(t *testing.T) {
	t.Run("a rename on the way, watched", func(t *testing.T) {
		_, home, p := twoRoots(t, func(ws, home string) {
			os.MkdirAll(filepath.Join(home, "node_modules/p/r.git"), 0o755)
			mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: "+home+"/node_modules/p/r.git\n")
		})
		if err := p.Watch(); err != nil {
			t.Fatal(err)
		}
		stale, _ := staleAfter(t, p, func() {
			os.Rename(filepath.Join(home, "node_modules/p"), filepath.Join(home, "node_modules/p.old"))
			os.MkdirAll(filepath.Join(home, "node_modules/p/r.git/modules/evil"), 0o755)
		})
		if !stale {
			t.Error("Stale = false after a directory on the way to r.git was replaced by one with a module")
		}
	})
	t.Run("a .git file made during the run", func(t *testing.T) {
		ws, home, p := twoRoots(t, func(ws, home string) {})
		mustWrite(t, filepath.Join(home, "node_modules/q.git/hooks/pre-commit"), "#!/bin/sh\n")
		mustWrite(t, filepath.Join(ws, "other/.git"), "gitdir: "+home+"/node_modules/q.git\n")
		if stale, err := p.Stale(); err != nil || !stale {
			t.Errorf("Stale = %v, %v after a .git file named a git directory in home; want true", stale, err)
		}
		hook := filepath.Join(home, "node_modules/q.git/hooks/pre-commit")
		var found bool
		for _, f := range p.Audit() {
			found = found || f.Path == hook
		}
		if !found {
			t.Errorf("the audit does not report %s", hook)
		}
	})
}

// A .git file may name any directory as its git directory: one that is a
// protected name, beneath one, above one or the root itself. None of it
// may leave a protected name writable, in the bind order bwrap applies
// or in the premount's.
func TestGitDirAtAProtectedName(t *testing.T) {
	for _, gitdir := range []string{"../.vscode", "../.vscode/x", "../.claude", ".."} {
		t.Run(gitdir, func(t *testing.T) {
			ws := t.TempDir()
			git(t, ws, "init", "-q")
			os.MkdirAll(filepath.Join(ws, ".vscode/x"), 0o755)
			os.MkdirAll(filepath.Join(ws, ".claude"), 0o755)
			mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: "+gitdir+"\n")
			p, err := prepare(t, ws, false, true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Release)
			ro, order := binds(p)
			for i, target := range order {
				for _, later := range order[i+1:] {
					if strings.HasPrefix(target, later+"/") {
						t.Errorf("%s is bound after %s, which it lies beneath: the later bind covers it", later, target)
					}
				}
				rel, _ := filepath.Rel(ws, target)
				if !ro[target] && beneathProtected(rel) {
					t.Errorf("%s is bound writable", target)
				}
			}
			if os.Geteuid() != 0 {
				t.Log("not root: the premount is not tried")
				return
			}
			err = inMountNS(t, func() error {
				if err := Premount(p.Roots); err != nil {
					return err
				}
				for _, f := range []string{".vscode/tasks.json", ".vscode/x/hooks/h", ".claude/commands/c.md", ".claude/hooks/h"} {
					if err := os.WriteFile(filepath.Join(ws, f), nil, 0o644); !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.ENOENT) {
						t.Errorf("write %s in the namespace: %v, want EROFS", f, err)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A .git file naming a git directory that is not there stops the start (a
// runtime could make it, unprotected), and the message names the file.
func TestGitFileNamingNothingRefused(t *testing.T) {
	for name, gitdir := range map[string]func(home string) string{
		"in its root":     func(string) string { return "../gone" },
		"in another root": func(home string) string { return home + "/gone" },
	} {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			ws, home := filepath.Join(base, "ws"), filepath.Join(base, "home")
			os.Mkdir(home, 0o755)
			mustWrite(t, filepath.Join(ws, "sub/.git"), "gitdir: "+gitdir(home)+"\n")
			_, err := Prepare(filepath.Join(base, "ledger.json"), []Root{
				{Host: ws, Dir: openDir(t, ws), Target: ws, Workspace: true},
				{Host: home, Dir: openDir(t, home), Target: home, Home: true},
			})
			want := filepath.Join(ws, "sub/.git") + " names "
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "does not exist") {
				t.Fatalf("Prepare: %v, want an error saying %q ... does not exist", err, want)
			}
			// Nothing of the refused start stays: no placeholder.
			if _, err := os.Lstat(filepath.Join(ws, ".vscode")); !os.IsNotExist(err) {
				t.Errorf("a placeholder of the refused start is left: %v", err)
			}
		})
	}
}
