package protect

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// watchedPlan is repoPlan with the roots watched, and a workspace that has
// a nested repository with a worktree, a module and a .git file.
func watchedPlan(t *testing.T) (string, *Plan) {
	t.Helper()
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	for _, dir := range []string{"src/pkg", "lib/.git/worktrees/wt", "lib/.git/modules/m/hooks", "wt"} {
		if err := os.MkdirAll(filepath.Join(ws, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: ../lib/.git/worktrees/wt\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	if err := p.Watch(); err != nil {
		t.Fatal(err)
	}
	return ws, p
}

// staleAfter reports Stale after change, and whether it scanned the roots.
func staleAfter(t *testing.T, p *Plan, change func()) (stale, scanned bool) {
	t.Helper()
	change()
	before := p.staleScans
	stale, err := p.Stale()
	if err != nil {
		t.Fatal(err)
	}
	return stale, p.staleScans > before
}

// Files made, written and removed in the watched directories cannot add a
// git directory: Stale answers from the watch, without a scan.
func TestWatchLetsFilesPass(t *testing.T) {
	ws, p := watchedPlan(t)
	stale, scanned := staleAfter(t, p, func() {
		os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("x"), 0o644)
		os.WriteFile(filepath.Join(ws, "src/pkg/main.go"), []byte("package main"), 0o644)
		os.WriteFile(filepath.Join(ws, "lib/.git/index.lock"), nil, 0o644)
		os.Remove(filepath.Join(ws, "lib/.git/index.lock"))
		os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("y"), 0o644)
		os.Rename(filepath.Join(ws, "notes.txt"), filepath.Join(ws, "src/notes.txt"))
	})
	if stale || scanned {
		t.Errorf("after files only: stale %v, scanned %v; want neither", stale, scanned)
	}
	// The watch ends with the first Stale: the next one scans.
	if _, scanned := staleAfter(t, p, func() {}); !scanned {
		t.Error("a second Stale did not scan")
	}
}

// Every change a repository can come with makes Stale scan, and the scan
// finds the new git directory.
func TestWatchSeesEveryWayInOfARepository(t *testing.T) {
	cases := map[string]func(t *testing.T, ws string){
		"git init at depth 3": func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "src/pkg/deep"), 0o755)
			git(t, filepath.Join(ws, "src/pkg/deep"), "init", "-q")
		},
		"a .git directory in a watched leaf": func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "src/pkg/.git"), 0o755)
		},
		"a repository moved in": func(t *testing.T, ws string) {
			outside := t.TempDir()
			os.MkdirAll(filepath.Join(outside, "r/.git"), 0o755)
			if err := os.Rename(filepath.Join(outside, "r"), filepath.Join(ws, "src/r")); err != nil {
				t.Fatal(err)
			}
		},
		"a .git file written": func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "lib/.git/worktrees/other"), 0o755)
			os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: ../lib/.git/worktrees/other\n"), 0o644)
		},
		"a .git file made by a rename": func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "gd"), 0o755)
			os.WriteFile(filepath.Join(ws, "src/g.tmp"), []byte("gitdir: ../gd\n"), 0o644)
			os.Rename(filepath.Join(ws, "src/g.tmp"), filepath.Join(ws, "src/.git"))
		},
		"a worktree added": func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "lib/.git/worktrees/wt2"), 0o755)
		},
		"a module added": func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "lib/.git/modules/m/modules/n/hooks"), 0o755)
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			ws, p := watchedPlan(t)
			if stale, scanned := staleAfter(t, p, func() { change(t, ws) }); !stale || !scanned {
				t.Errorf("stale %v, scanned %v; want both", stale, scanned)
			}
		})
	}
}

// A repository made after Prepare but before Watch is stale at once.
func TestWatchAfterANewRepository(t *testing.T) {
	ws, p := repoPlan(t)
	git(t, filepath.Join(ws), "init", "-q", "sub")
	if err := p.Watch(); err != nil {
		t.Fatal(err)
	}
	if stale, scanned := staleAfter(t, p, func() {}); !stale || !scanned {
		t.Errorf("stale %v, scanned %v; want both", stale, scanned)
	}
}

// What the watch cannot vouch for is scanned: a .git file written through
// another name (its other link, or an fd opened by a name since removed:
// no watched directory hears of it), a lost event (the queue overflowed),
// a new directory, a mount.
func TestWatchScansWhatItCannotVouchFor(t *testing.T) {
	t.Run(".git file written through another name", func(t *testing.T) {
		ws := t.TempDir()
		git(t, ws, "init", "-q")
		os.MkdirAll(filepath.Join(ws, "wt"), 0o755)
		os.MkdirAll(filepath.Join(ws, "a/b/c/d/gd"), 0o755) // deeper than the scan and the watch go
		os.WriteFile(filepath.Join(ws, "name"), []byte("gitdir: ../.git\n"), 0o644)
		if err := os.Link(filepath.Join(ws, "name"), filepath.Join(ws, "wt/.git")); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(ws, "name"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		os.Remove(filepath.Join(ws, "name"))
		p, err := prepare(t, ws, false, true)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release()
		if err := p.Watch(); err != nil {
			t.Fatal(err)
		}
		stale, scanned := staleAfter(t, p, func() {
			f.Truncate(0)
			f.WriteAt([]byte("gitdir: ../a/b/c/d/gd\n"), 0)
		})
		if !stale || !scanned {
			t.Errorf("after wt/.git was written through its removed name: stale %v, scanned %v; want both", stale, scanned)
		}
	})
	t.Run("overflow", func(t *testing.T) {
		ws, p := watchedPlan(t)
		max, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
		if err != nil {
			t.Fatal(err)
		}
		var n int
		fmt.Sscan(string(max), &n)
		stale, scanned := staleAfter(t, p, func() {
			for i := 0; i <= n; i++ {
				f, err := os.Create(filepath.Join(ws, "src", fmt.Sprint("f", i)))
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
		})
		if stale || !scanned {
			t.Errorf("after %d files: stale %v, scanned %v; want a scan that finds nothing", n+1, stale, scanned)
		}
	})
	t.Run("a new directory", func(t *testing.T) {
		ws, p := watchedPlan(t)
		if stale, scanned := staleAfter(t, p, func() { os.Mkdir(filepath.Join(ws, "new"), 0o755) }); stale || !scanned {
			t.Errorf("stale %v, scanned %v; want a scan that finds nothing", stale, scanned)
		}
	})
	t.Run("a mount", func(t *testing.T) {
		testutil.RequiresRoot(t)
		ws, p := watchedPlan(t)
		repo := t.TempDir()
		git(t, repo, "init", "-q")
		stale, scanned := staleAfter(t, p, func() {
			if err := unix.Mount(repo, filepath.Join(ws, "src/pkg"), "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(filepath.Join(ws, "src/pkg"), unix.MNT_DETACH) })
		})
		if !stale || !scanned {
			t.Errorf("after a repository was mounted in: stale %v, scanned %v; want both", stale, scanned)
		}
	})
}

// A root on a filesystem whose changes inotify may not all see is not
// watched.
func TestWatchRefuses(t *testing.T) {
	w := &rootsWatch{devs: map[uint64]bool{}, mounts: map[uint64]bool{}}
	fd, err := unix.Open("/proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := w.dir(fd, Root{Host: "/proc"}, "."); err == nil || !strings.Contains(err.Error(), "inotify may not see") {
		t.Errorf("watch /proc: %v, want a refusal", err)
	}
}

// watched is a plan of ws with its roots watched.
func watched(t *testing.T, ws string) *Plan {
	t.Helper()
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	if err := p.Watch(); err != nil {
		t.Fatal(err)
	}
	return p
}

// What an outside review of the watch found: a git directory a .git file
// names, put elsewhere by renaming a directory on its way that the walk
// does not look at (under node_modules, deeper than it goes, inside a
// .git); a symlink made where a git directory's modules go; a mount of
// another directory at the same place, which mountinfo does not tell.
func TestWatchReviewedWaysIn(t *testing.T) {
	cases := map[string]reviewedCase{
		"a directory on a .git file's way, under node_modules, renamed":   renamedOnTheWay("node_modules/p/gd", "node_modules/p", "modules/evil/hooks"),
		"a directory on a .git file's way, deeper than the walk, renamed": renamedOnTheWay("a/b/c/d/e/gd", "a/b/c/d/e", "worktrees/evil"),
		"a directory on a .git file's way, inside a .git, renamed":        renamedOnTheWay(".git/x/y/gd", ".git/x/y", "modules/evil/hooks"),
		"a symlink made as a git directory's modules": {
			func(t *testing.T, ws string) { os.MkdirAll(filepath.Join(ws, "store/evil/hooks"), 0o755) },
			func(t *testing.T, ws string) { os.Symlink("../store", filepath.Join(ws, ".git/modules")) },
		},
		"a mount swapped for one of another directory at the same place": {
			func(t *testing.T, ws string) {
				testutil.RequiresRoot(t)
				src := t.TempDir()
				os.MkdirAll(filepath.Join(src, "a/src"), 0o755)
				os.Mkdir(filepath.Join(ws, "m"), 0o755)
				if err := unix.Mount(filepath.Join(src, "a/src"), filepath.Join(ws, "m"), "", unix.MS_BIND, ""); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { unix.Unmount(filepath.Join(ws, "m"), unix.MNT_DETACH) })
				os.WriteFile(filepath.Join(ws, "src.path"), []byte(src), 0o644)
			},
			func(t *testing.T, ws string) {
				src, _ := os.ReadFile(filepath.Join(ws, "src.path"))
				if err := unix.Unmount(filepath.Join(ws, "m"), 0); err != nil {
					t.Fatal(err)
				}
				os.Rename(filepath.Join(string(src), "a"), filepath.Join(string(src), "a.old"))
				os.MkdirAll(filepath.Join(string(src), "a/src/.git"), 0o755)
				if err := unix.Mount(filepath.Join(string(src), "a/src"), filepath.Join(ws, "m"), "", unix.MS_BIND, ""); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ws := t.TempDir()
			git(t, ws, "init", "-q")
			c.setup(t, ws)
			p := watched(t, ws)
			before, err := findGitDirs(p.roots[0])
			if err != nil {
				t.Fatal(err)
			}
			stale, _ := staleAfter(t, p, func() { c.change(t, ws) })
			after, err := findGitDirs(p.roots[0])
			if err != nil {
				t.Fatal(err)
			}
			if len(after) <= len(before) {
				t.Fatalf("the change made no git directory a scan finds: %q, then %q", before, after)
			}
			if !stale {
				t.Errorf("Stale = false; a scan finds %q, the plan protects %q", after, p.GitDirs)
			}
		})
	}
}

// reviewedCase is a state a watched plan starts from (setup) and a change
// after which a scan finds a git directory the plan does not protect.
type reviewedCase struct {
	setup, change func(t *testing.T, ws string)
}

// renamedOnTheWay: wt/.git names gd; the change renames renamed, a
// directory on gd's way, and makes gd again there with made beneath it.
func renamedOnTheWay(gd, renamed, made string) reviewedCase {
	return reviewedCase{
		func(t *testing.T, ws string) {
			os.MkdirAll(filepath.Join(ws, "wt"), 0o755)
			os.MkdirAll(filepath.Join(ws, gd), 0o755)
			os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: ../"+gd+"\n"), 0o644)
		},
		func(t *testing.T, ws string) {
			os.Rename(filepath.Join(ws, renamed), filepath.Join(ws, renamed+".old"))
			os.MkdirAll(filepath.Join(ws, gd, made), 0o755)
		},
	}
}

// A .git file's path is where git goes: its symlinks followed before its
// "..", as git does, not the path cleaned as written.
func TestGitFileFollowedAsGitDoes(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	for _, dir := range []string{"wt/gd", "node_modules/x", "node_modules/gd"} {
		os.MkdirAll(filepath.Join(ws, dir), 0o755)
	}
	os.Symlink("../node_modules/x", filepath.Join(ws, "wt/l"))
	os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: l/../gd\n"), 0o644)
	got, err := findGitDirs(Root{Host: ws, Dir: openDir(t, ws)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "node_modules/gd") || slices.Contains(got, "wt/gd") {
		t.Errorf("found %q, want node_modules/gd (where git goes) and not wt/gd", got)
	}
}

// A .git file that cannot be read stops the scan: the repository it names
// could not be protected.
func TestUnreadableGitFileRefused(t *testing.T) {
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, "wt"), 0o755)
	os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: ../gd\n"), 0o644)
	f, err := os.Open(filepath.Join(ws, "wt/.git"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A write lease makes a non-blocking open fail until it is broken.
	signal.Ignore(syscall.SIGIO)
	defer signal.Reset(syscall.SIGIO)
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		t.Skipf("no lease: %v", err)
	}
	defer unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	if _, err := findGitDirs(Root{Host: ws, Dir: openDir(t, ws)}); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Errorf("scan with wt/.git leased: %v, want a refusal", err)
	}
}

// A released plan is neither watched nor checked.
func TestReleasedPlanRefused(t *testing.T) {
	_, p := repoPlan(t)
	p.Release()
	if err := p.Watch(); err == nil {
		t.Error("Watch of a released plan succeeded")
	}
	if _, err := p.Stale(); err == nil {
		t.Error("Stale of a released plan succeeded")
	}
}
