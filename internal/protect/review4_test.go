package protect

import (
	"os"
	"path/filepath"
	"testing"
)

// Findings of the fourth outside review: the skip in .git/modules of a
// repository by isRepository (bb7fe6d, since removed), the walk's bounds
// against git's submodule recursion, the scan's errors, the watch. Each claim about git was
// checked with git 2.39.5 in temp directories.

// makeRepository makes dir pass isRepository (bb7fe6d, since removed): a HEAD git validates, and
// objects and refs directories.
func makeRepository(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{"objects", "refs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, filepath.Join(dir, "HEAD"), "ref: refs/heads/main\n")
}

// hideBeneath are ways to make .git/modules/libs pass isRepository (bb7fe6d, since removed), so
// that the scan does not look at .git/modules/libs/foo, while git still
// uses libs/foo as the submodule's git directory:
//
//   - libs is a repository to git too: git checks is_git_directory on the
//     parts of a submodule's name when it clones or checks out a submodule
//     (validate_submodule_git_dir: `git submodule update --init` and
//     `git checkout --recurse-submodules` refuse libs/foo then), but
//     `git fetch` does not: its on-demand recursion (the default) fetches a
//     submodule that is not checked out in its git directory. Checked: with
//     libs a repository that makes `submodule update --init` refuse,
//     `git fetch` in the superproject, after upstream moved the
//     submodule's commit, printed "Fetching submodule libs/foo" and ran
//     .git/modules/libs/foo/hooks/reference-transaction.
//   - objects or refs not searchable by the host's user (mode 0600):
//     is_git_directory tests them with access(X_OK), isRepository (bb7fe6d, since removed) with
//     lstat only. Checked as uid 1000: `git submodule update --init` took
//     libs for no repository and ran libs/foo/hooks/post-checkout.
//   - HEAD unreadable by the host's user (mode 0): a root daemon opens it,
//     git as the user cannot (validate_headref fails). Checked as uid
//     1000: the same post-checkout ran.
var hideBeneath = map[string]func(t *testing.T, libs string){
	"a repository to git as well": func(t *testing.T, libs string) { makeRepository(t, libs) },
	"objects not searchable": func(t *testing.T, libs string) {
		makeRepository(t, libs)
		chmod(t, filepath.Join(libs, "objects"), 0o600)
	},
	"refs not searchable": func(t *testing.T, libs string) {
		makeRepository(t, libs)
		chmod(t, filepath.Join(libs, "refs"), 0o600)
	},
	"HEAD unreadable to the host's user": func(t *testing.T, libs string) {
		if os.Geteuid() != 0 {
			t.Skip("only a root daemon reads a HEAD of mode 0")
		}
		makeRepository(t, libs)
		chmod(t, filepath.Join(libs, "HEAD"), 0)
	},
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(path, 0o755) })
}

// A part of a submodule's name that passes isRepository (bb7fe6d, since removed) hides the
// submodule's git directory beneath it from Prepare.
//
// Attack: the repository has a submodule libs/foo that is not checked out
// (its git directory stays at .git/modules/libs/foo). In one session the
// runtime makes .git/modules/libs a repository (HEAD, objects, refs: libs
// is only pinned, and its audit finds nothing in libs's own hooks or
// config). The next session's Prepare protects libs and does not look
// beneath it, so libs/foo/hooks and libs/foo/config are writable: the
// runtime writes hooks/reference-transaction (or, for the last three
// cases, post-checkout). The user's next `git fetch` in the workspace
// fetches the submodule in .git/modules/libs/foo and runs the hook; in the
// last three cases `git submodule update --init` does too. (This session's
// own audit happens to report the hook: Prepare's commondir placeholder in
// libs makes libs no repository to isRepository (bb7fe6d, since removed) for every later scan, see
// TestReview4CommondirPlaceholderMakesASubmoduleANamePart; the next test
// is the attack the audit misses.)
func TestReview4RepositoryInModulesHidesASubmoduleGitDir(t *testing.T) {
	for name, hide := range hideBeneath {
		t.Run(name, func(t *testing.T) { wantLibsFooProtected(t, hide, "is "+name) })
	}
}

// The same within one run: the audit does not look beneath a part of a
// name that passes isRepository (bb7fe6d, since removed).
//
// Attack: in one session the runtime makes .git/modules/libs/foo, a git
// directory with hooks/reference-transaction, for the repository's
// submodule libs/foo (not checked out), and makes .git/modules/libs a
// repository. The end's audit looks at libs only and reports nothing; the
// host's `git fetch` runs the hook. The next start does not protect libs/foo
// either (the first test); only that session's end audit, if there is one,
// reports the hook, after the user may have fetched.
func TestReview4AuditMissesAGitDirBeneathARepositoryInModules(t *testing.T) {
	for name, hide := range hideBeneath {
		t.Run(name, func(t *testing.T) { wantLibsFooAudited(t, hide, "reference-transaction", name) })
	}
}

// stopTheScan are things a runtime can leave in a root that make the scan
// return an error at once (addGitDir's and gitEntry's errors are returned,
// not collected as refused: bb7fe6d collected only the modules refusals),
// each sorted before "zz".
var stopTheScan = map[string]func(t *testing.T, ws string){
	"a commondir that is a directory in .git/modules/aa": func(t *testing.T, ws string) {
		if err := os.MkdirAll(filepath.Join(ws, ".git/modules/aa/commondir"), 0o755); err != nil {
			t.Fatal(err)
		}
	},
	"a commondir through a magic link in .git/modules/aa": func(t *testing.T, ws string) {
		mustWrite(t, filepath.Join(ws, ".git/modules/aa/commondir"), "/proc/self/cwd\n")
	},
	"a symlinked .git in aa": func(t *testing.T, ws string) {
		os.Mkdir(filepath.Join(ws, "aa"), 0o755)
		if err := os.Symlink("/nonexistent", filepath.Join(ws, "aa/.git")); err != nil {
			t.Fatal(err)
		}
	},
}

// The audit stops at the first error of the scan: what the walk and the
// modules scan have not reached by then goes unreported (review3's fourth
// finding, through the errors it did not collect).
//
// Attack: during a session the runtime plants .git/modules/zz, a git
// directory with hooks/post-checkout (a submodule named zz), and
// one of stopTheScan. The audit shows only that error ("... make it a
// readable file, or remove it", "... is a symlink ..."). The user removes
// it; the next start protects zz as it finds it, hook included, and no
// audit ever names the hook, which `git submodule update` then runs. The
// same hides zz/.git, a repository the walk reaches after aa.
func TestReview4AuditStopsAtAnErrorAndHidesAHook(t *testing.T) {
	for name, plant := range stopTheScan {
		t.Run(name, func(t *testing.T) {
			ws, p := repoPlan(t)
			hook := plantHook(t, ws, ".git/modules/zz", "post-checkout")
			nested := filepath.Join(ws, "zz")
			git(t, ws, "init", "-q", nested)
			nestedHook := filepath.Join(nested, ".git/hooks/post-checkout")
			mustWrite(t, nestedHook, "#!/bin/sh\n")
			plant(t, ws)
			found := p.Audit()
			for _, h := range []string{hook, nestedHook} {
				if !hasFinding(found, h) {
					t.Errorf("the audit did not report %s next to %s; it found %v", h, name, found)
				}
			}
		})
	}
}

// Prepare gives every git directory it protects a commondir placeholder
// (".\n") where it has none, and isRepository (bb7fe6d, since removed) takes no directory with a
// commondir for a repository: while a run lives, every later scan (the
// run's own Watch and Audit, a concurrent session's Prepare, Stale) takes a
// real submodule's git directory .git/modules/foo for a part of a name and
// descends into it: its logs (logs/HEAD marks it a git directory), its
// objects, and its refs, where a remote's branch with a few slashes is
// deeper than maxModuleNameDepth. checked: `git submodule add` clones with
// logallrefupdates, and a fetch of a dependabot branch
// (dependabot/npm_and_yarn/client/app/lodash-4.17.21) writes
// refs/remotes/origin/dependabot/npm_and_yarn/client/app/..., whose app is
// the eighth directory beneath modules.
//
// What it costs (no attack needed, a runtime can also make one: `git -C
// <submodule> branch a/b/c/d/e/f` in a checked-out submodule): the end's
// audit of every session reports "... is nested 8 directories deep ...,
// so a git directory in it could not be protected: remove it", telling the
// user to delete refs of a real repository; a warm boundary's Watch and
// Stale fail; a second session of the agent started while the first runs
// fails its start with that message, and keeps failing while any run
// lives. Without the deep ref, foo/logs is still taken for a git directory
// that the plan does not protect, so every warm boundary is stale.
func TestReview4CommondirPlaceholderMakesASubmoduleANamePart(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	g := submoduleGitDir(t, ws, "foo")
	git(t, ws, "--git-dir="+g, "--work-tree="+t.TempDir(), "update-ref", "refs/remotes/origin/dependabot/npm_and_yarn/client/app/lodash-4.17.21", "HEAD")
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatalf("the first start failed: %v", err)
	}
	defer p.Release()
	if found := p.Audit(); len(found) != 0 {
		t.Errorf("the audit of a run that wrote nothing found %v", found)
	}
	if err := p.Watch(); err != nil {
		t.Errorf("Watch: %v", err)
	} else if stale, err := p.Stale(); stale || err != nil {
		t.Errorf("Stale = %v, %v right after Watch; want false", stale, err)
	}
	second, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatalf("a second session's start while the first runs failed: %v", err)
	}
	second.Release()
}
