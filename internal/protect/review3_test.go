package protect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Findings of the third outside review: the scan of .git/modules since
// submodule names with slashes (6117fc3), and the Claude Code names.

// plantMark puts one of gitMarks into dir in a form that makes the scan
// take dir for a git directory while git does not (git's is_git_directory
// wants a HEAD that reads as a ref, objects and refs): an empty hooks
// directory, a HEAD that is a directory, a HEAD of garbage, a commondir.
// Checked with git 2.39: with any of these in .git/modules/libs,
// `git submodule update --init` still uses .git/modules/libs/foo and runs
// its hooks/post-checkout (git refuses libs/foo only when libs passes
// is_git_directory: "submodule git dir ... is inside git dir ...").
var plantMark = map[string]func(t *testing.T, dir string){
	"an empty hooks directory": func(t *testing.T, dir string) {
		if err := os.MkdirAll(filepath.Join(dir, "hooks"), 0o755); err != nil {
			t.Fatal(err)
		}
	},
	"a HEAD that is a directory": func(t *testing.T, dir string) {
		if err := os.MkdirAll(filepath.Join(dir, "HEAD"), 0o755); err != nil {
			t.Fatal(err)
		}
	},
	"a HEAD of garbage": func(t *testing.T, dir string) { mustWrite(t, filepath.Join(dir, "HEAD"), "garbage\n") },
	"a commondir":       func(t *testing.T, dir string) { mustWrite(t, filepath.Join(dir, "commondir"), "../..\n") },
}

// A part of a submodule's name that holds one of gitMarks is taken for a
// git directory, and the scan does not look beneath it: the submodule's
// real git directory there goes unprotected.
//
// Attack: the repository has a submodule libs/foo, not checked out (git
// keeps its git directory at .git/modules/libs/foo). In one session the
// runtime makes the empty directory .git/modules/libs/hooks (.git/modules
// is writable; libs is only pinned). That session's audit sees libs as a
// new git directory with an empty hooks and says nothing. The next
// session's Prepare takes libs for the git directory and never protects
// libs/foo, so the runtime writes .git/modules/libs/foo/hooks/post-checkout;
// that session's audit does not see it either. The user's next
// `git submodule update --init` on the host runs it.
func TestReview3MarkedNamePartHidesASubmoduleGitDir(t *testing.T) {
	for name, plant := range plantMark {
		t.Run(name, func(t *testing.T) { wantLibsFooProtected(t, plant, "holds "+name) })
	}
}

// The same within one run: the audit does not report a hook in a
// submodule's git directory beneath a marked part of its name.
//
// Attack: in one session the runtime makes .git/modules/libs/hooks (empty)
// and .git/modules/libs/foo, a git directory with hooks/post-checkout, for
// the repository's uninitialized submodule libs/foo. The end's audit looks
// at libs only; the host's `git submodule update --init` runs the hook.
func TestReview3AuditMissesAGitDirBeneathAMarkedNamePart(t *testing.T) {
	for name, plant := range plantMark {
		t.Run(name, func(t *testing.T) { wantLibsFooAudited(t, plant, "post-checkout", "holding "+name) })
	}
}

// A symlink in .git/modules, as a part of a submodule's name or as its git
// directory, is skipped (os.ReadDir's entry is no directory), where git
// follows it.
//
// Attack: the runtime makes a git directory with hooks/post-checkout where
// no scan looks (.git/stash/foo: the walk only looks for .git entries),
// and links it in: .git/modules/libs -> ../stash, or
// .git/modules/libs/foo -> ../../stash/foo, or (a submodule named foo)
// .git/modules/foo -> ../stash/foo. The audit reports nothing and a later
// Prepare neither protects nor refuses it; the host's
// `git submodule update --init` follows the link and runs the hook
// (checked with git 2.39 for all three).
func TestReview3SymlinkInModulesHidesAGitDir(t *testing.T) {
	cases := map[string]struct{ link, to string }{
		"a part of the name":     {".git/modules/libs", "../stash"},
		"the git directory":      {".git/modules/libs/foo", "../../stash/foo"},
		"a top-level module dir": {".git/modules/foo", "../stash/foo"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ws, p := repoPlan(t)
			hook := plantHook(t, ws, ".git/stash/foo", "post-checkout")
			stash := filepath.Join(ws, ".git/stash/foo")
			link := filepath.Join(ws, c.link)
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(c.to, link); err != nil {
				t.Fatal(err)
			}
			found := p.Audit()
			reported := hasFinding(found, hook)
			for _, f := range found {
				if strings.HasPrefix(f.Path, filepath.Join(ws, ".git/modules")) || strings.Contains(f.Reason, c.link) {
					reported = true
				}
			}
			if !reported {
				t.Errorf("the audit reported nothing about %s -> %s (%s holds a hook); it found %v", c.link, c.to, hook, found)
			}
			// The next session's start must protect it or refuse.
			next, err := prepare(t, ws, false, true)
			if err != nil {
				return
			}
			defer next.Release()
			ro, _ := binds(next)
			if !ro[filepath.Join(ws, c.link, "hooks")] && !ro[filepath.Join(stash, "hooks")] {
				t.Errorf("a start after %s -> %s neither refused nor bound its hooks read-only", c.link, c.to)
			}
		})
	}
}

// The depth bound stops the scan at the first name too deep, so the audit
// reports that error and no more of the root: not the hooks of the
// modules after it, nor of the repositories the walk has yet to reach.
//
// Attack: during a session the runtime plants .git/modules/zz, a git
// directory with hooks/post-checkout (a submodule named zz), and an empty
// chain .git/modules/aa/d/d/... nine deep. The audit shows only "... is
// nested 9 directories deep ...: remove it". The user removes aa; the next
// start protects zz as it finds it, hook included, and no audit ever
// names the hook, which `git submodule update` then runs on the host.
func TestReview3AuditStopsAtADeepNameAndHidesAHook(t *testing.T) {
	ws, p := repoPlan(t)
	deep := filepath.Join(append([]string{ws, ".git/modules/aa"}, strings.Split(strings.Repeat("d/", maxModuleNameDepth), "/")...)...)
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	hook := plantHook(t, ws, ".git/modules/zz", "post-checkout")
	found := p.Audit()
	if !hasFinding(found, hook) {
		t.Errorf("the audit did not report %s next to a name too deep; it found %v", hook, found)
	}
}

// Claude Code also loads project skills from .claude/skills/<name>/SKILL.md
// (its docs: frontmatter hooks, and !`command` lines it runs in a shell
// before the skill's text is sent; allowed-tools that run unprompted), as
// it does .claude/commands and .claude/agents, which are protected.
//
// Attack: the runtime writes .claude/skills/x/SKILL.md with a hook or a
// !`curl ... | sh` line; the user's next Claude Code on the host in that
// workspace loads it and runs it.
func TestReview3ClaudeSkillsProtected(t *testing.T) {
	_, p := repoPlan(t)
	ro, _ := binds(p)
	ws := p.roots[0].Host
	if !ro[filepath.Join(ws, ".claude/skills")] {
		t.Errorf("%s is not bound read-only", filepath.Join(ws, ".claude/skills"))
	}
}
