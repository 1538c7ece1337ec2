package protect

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// The test binary doubles as the process that runs Verify inside a real
// bwrap sandbox (see runVerify).
func TestMain(m *testing.M) {
	if os.Getenv("PROTECT_TEST_VERIFY") == "1" {
		checks, err := ReadChecks(3)
		if err == nil {
			err = Verify(checks)
		}
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@t"}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v in %s: %v: %s", args, dir, err, out)
	}
	return string(out)
}

func openDir(t *testing.T, dir string) *os.File {
	t.Helper()
	f, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// prepare protects dir as one root seen at the same path.
func prepare(t *testing.T, dir string, home, workspace bool) (*Plan, error) {
	t.Helper()
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	return Prepare(ledger, []Root{{Host: dir, Dir: openDir(t, dir), Target: dir, Home: home, Workspace: workspace}})
}

// repoPlan is a workspace holding a repository, protected for a run that
// the test's cleanup ends.
func repoPlan(t *testing.T) (string, *Plan) {
	t.Helper()
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	return ws, p
}

// binds maps each bind's target to whether it is read-only, and lists the
// targets in order.
func binds(p *Plan) (map[string]bool, []string) {
	ro := map[string]bool{}
	var order []string
	for _, r := range p.Roots {
		for _, b := range r.Binds {
			ro[b.Target] = b.ReadOnly
			order = append(order, b.Target)
		}
	}
	return ro, order
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

func TestPrepareWorkspace(t *testing.T) {
	ws := t.TempDir()
	git(t, ws, "init", "-q")
	os.MkdirAll(filepath.Join(ws, "sub", "nested"), 0o755)
	git(t, filepath.Join(ws, "sub", "nested"), "init", "-q")
	os.Mkdir(filepath.Join(ws, ".vscode"), 0o700)
	os.WriteFile(filepath.Join(ws, ".gitmodules"), nil, 0o600)
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	ro, order := binds(p)
	for target, wantRO := range map[string]bool{
		ws:                             false, // the root itself comes first
		ws + "/.git":                   false, // a mount point: it cannot be renamed away
		ws + "/.git/hooks":             true,
		ws + "/.git/config":            true,
		ws + "/.git/commondir":         true, // a placeholder naming the git directory itself
		ws + "/.git/config.worktree":   true,
		ws + "/sub/nested/.git":        false,
		ws + "/sub/nested/.git/config": true,
		ws + "/.vscode":                true,
		ws + "/.gitmodules":            true,
		ws + "/.mcp.json":              true,
		ws + "/.bashrc":                true,
		ws + "/.claude/commands":       true,
		ws + "/.claude/settings.json":  true, // Claude Code runs its hooks
		ws + "/sub/nested/.git/hooks":  true,
	} {
		got, ok := ro[target]
		if !ok || got != wantRO {
			t.Errorf("bind %s: present %v read-only %v, want present, read-only %v", target, ok, got, wantRO)
		}
	}
	if _, ok := ro[ws+"/.git/HEAD"]; ok {
		t.Errorf("%s/.git/HEAD is bound; only the protected names should be", ws)
	}
	if order[0] != ws {
		t.Errorf("first bind is %s, want the root %s", order[0], ws)
	}
	if g, h := indexOf(order, ws+"/.git"), indexOf(order, ws+"/.git/hooks"); g > h {
		t.Error("the .git bind comes after the read-only binds inside it, which it would cover")
	}
	// Absent names got placeholders on disk: directories in a workspace,
	// which git ignores, so the repository's status does not change.
	for _, ph := range []string{".mcp.json", ".bashrc", ".claude/commands", ".claude/settings.local.json"} {
		if fi, err := os.Lstat(filepath.Join(ws, ph)); err != nil || !fi.IsDir() {
			t.Errorf("placeholder %s: %v, want an empty directory", ph, err)
		}
	}
	if got := git(t, ws, "status", "--porcelain"); strings.Contains(got, ".mcp.json") || strings.Contains(got, ".claude") {
		t.Errorf("git status shows placeholders: %q", got)
	}
	if want := []string{ws + "/.git", ws + "/sub/nested/.git"}; strings.Join(p.GitDirs, " ") != strings.Join(want, " ") {
		t.Errorf("GitDirs = %q, want %q", p.GitDirs, want)
	}
	// The last run to end removes them, parents made for them included.
	p.Release()
	for _, ph := range []string{".mcp.json", ".bashrc", ".claude", ".git/commondir", ".git/hooks"} {
		if _, err := os.Lstat(filepath.Join(ws, ph)); !os.IsNotExist(err) && ph != ".git/hooks" {
			t.Errorf("placeholder %s still there after the run: %v", ph, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, ".vscode")); err != nil {
		t.Errorf("the existing .vscode went with the placeholders: %v", err)
	}
}

func TestCommondirPlaceholderKeepsTheRepositoryWorking(t *testing.T) {
	ws, _ := repoPlan(t)
	if b, err := os.ReadFile(filepath.Join(ws, ".git", "commondir")); err != nil || string(b) != ".\n" {
		t.Fatalf("commondir placeholder = %q, %v; want \".\\n\"", b, err)
	}
	os.WriteFile(filepath.Join(ws, "a"), []byte("a\n"), 0o644)
	git(t, ws, "add", "a")
	git(t, ws, "commit", "-qm", "a")
	git(t, ws, "branch", "b")
	if log := git(t, ws, "log", "--oneline"); !strings.Contains(log, " a") {
		t.Errorf("git log = %q", log)
	}
	git(t, ws, "fsck", "--no-progress")
}

func TestPrepareHomeUsesFiles(t *testing.T) {
	home := t.TempDir()
	p, err := prepare(t, home, true, false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	// Shells source rc files from the home: an absent one is an empty file.
	if fi, err := os.Lstat(filepath.Join(home, ".bashrc")); err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
		t.Errorf(".bashrc placeholder in the home: %v, want an empty file", err)
	}
	if fi, err := os.Lstat(filepath.Join(home, ".vscode")); err != nil || !fi.IsDir() {
		t.Errorf(".vscode placeholder in the home: %v, want an empty directory", err)
	}
	// A home is not a workspace: it gets no repository.
	if _, err := os.Lstat(filepath.Join(home, ".git")); !os.IsNotExist(err) {
		t.Errorf("the home got a .git: %v", err)
	}
}

func TestPrepareRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, ws string)
		want  string
	}{
		{"symlinked rc file", func(t *testing.T, ws string) {
			os.Symlink("/etc/hostname", filepath.Join(ws, ".bashrc"))
		}, "a symlink is in the way"},
		{"symlinked parent", func(t *testing.T, ws string) {
			os.Symlink(t.TempDir(), filepath.Join(ws, ".claude"))
		}, ".claude cannot be made read-only: a symlink"},
		{"symlinked .git of a nested repository", func(t *testing.T, ws string) {
			os.Mkdir(filepath.Join(ws, "real"), 0o755)
			git(t, filepath.Join(ws, "real"), "init", "-q")
			os.Mkdir(filepath.Join(ws, "sub"), 0o755)
			os.Symlink("../real/.git", filepath.Join(ws, "sub", ".git"))
		}, "sub/.git is a symlink"},
		{"symlinked hooks", func(t *testing.T, ws string) {
			git(t, ws, "init", "-q")
			os.RemoveAll(filepath.Join(ws, ".git", "hooks"))
			os.Symlink(t.TempDir(), filepath.Join(ws, ".git", "hooks"))
		}, ".git/hooks cannot be made read-only"},
		{"hard-linked config", func(t *testing.T, ws string) {
			git(t, ws, "init", "-q")
			os.Link(filepath.Join(ws, ".git", "config"), filepath.Join(ws, "innocent.txt"))
		}, "has 2 hard links"},
		{"hard-linked hook", func(t *testing.T, ws string) {
			git(t, ws, "init", "-q")
			os.WriteFile(filepath.Join(ws, "hook.sh"), []byte("#!/bin/sh\n"), 0o755)
			os.Link(filepath.Join(ws, "hook.sh"), filepath.Join(ws, ".git", "hooks", "pre-commit"))
		}, "pre-commit has 2 hard links"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := t.TempDir()
			tc.setup(t, ws)
			ledger := filepath.Join(t.TempDir(), "ledger.json")
			p, err := Prepare(ledger, []Root{{Host: ws, Dir: openDir(t, ws), Target: ws, Workspace: true}})
			if err == nil {
				p.Release()
				t.Fatalf("Prepare succeeded, want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Prepare = %v, want an error containing %q", err, tc.want)
			}
			// Nothing of the failed run is left: no placeholder, no run.
			if _, err := os.Lstat(filepath.Join(ws, ".mcp.json")); !os.IsNotExist(err) {
				t.Errorf("a placeholder is left after a refusal: %v", err)
			}
			l, _ := openLedger(ledger)
			d, _ := l.read()
			l.close()
			if len(d.Runs) != 0 || len(d.Placeholders) != 0 {
				t.Errorf("ledger after a refusal = %+v, want empty", d)
			}
		})
	}
}

func TestEnsureRepository(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a\n"), 0o644)
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	ro, _ := binds(p)
	if !ro[ws+"/.git/hooks"] || !ro[ws+"/.git/config"] {
		t.Errorf("the new repository's hooks and config are not bound read-only: %v", ro)
	}
	p.Release()
	// A real repository git works with, on branch main.
	git(t, ws, "add", "a.txt")
	git(t, ws, "commit", "-qm", "first")
	if b := strings.TrimSpace(git(t, ws, "branch", "--show-current")); b != "main" {
		t.Errorf("branch = %q, want main", b)
	}
	git(t, ws, "fsck", "--no-progress")
	if _, err := os.Lstat(filepath.Join(ws, ".git.agentconnect-new")); !os.IsNotExist(err) {
		t.Errorf("the temporary directory is left: %v", err)
	}
	// A workspace that has one keeps it as it is.
	head := git(t, ws, "rev-parse", "HEAD")
	p, err = prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
	if got := git(t, ws, "rev-parse", "HEAD"); got != head {
		t.Errorf("HEAD after a second Prepare = %s, want %s", got, head)
	}
}

// A root that holds a workspace with no repository (a read-write mount of
// its parent, listed first) protects the repository the start makes there:
// it is made before any root is scanned.
func TestPrepareRootHoldingANewRepository(t *testing.T) {
	outer := t.TempDir()
	ws := filepath.Join(outer, "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	p, err := Prepare(ledger, []Root{
		{Host: outer, Dir: openDir(t, outer), Target: "/mnt"},
		{Host: ws, Dir: openDir(t, ws), Target: "/workspace", Workspace: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	ro, _ := binds(p)
	for _, target := range []string{"/mnt/proj/.git/hooks", "/mnt/proj/.git/config", "/workspace/.git/hooks"} {
		if !ro[target] {
			t.Errorf("%s is not bound read-only (binds %v)", target, ro)
		}
	}
	if want := []string{filepath.Join(ws, ".git"), filepath.Join(ws, ".git")}; strings.Join(p.GitDirs, " ") != strings.Join(want, " ") {
		t.Errorf("GitDirs = %q, want %q (the repository, once from each root)", p.GitDirs, want)
	}
}

func TestOpenPathRefusesSymlinks(t *testing.T) {
	agent := t.TempDir()
	outside := t.TempDir()
	os.Mkdir(filepath.Join(agent, "workspace"), 0o700)
	os.Symlink(outside, filepath.Join(agent, "home"))
	f, err := OpenPath(agent, filepath.Join(agent, "workspace"))
	if err != nil {
		t.Fatalf("OpenPath(workspace) = %v", err)
	}
	f.Close()
	if _, err := OpenPath(agent, filepath.Join(agent, "home")); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("openBeneath through a symlink = %v, want a refusal naming the symlink", err)
	}
	if _, err := OpenPath(agent, outside); err == nil {
		t.Error("openBeneath of a path outside the root succeeded")
	}
}

func TestFindGitDirsFollowsGitFiles(t *testing.T) {
	ws := t.TempDir()
	os.Mkdir(filepath.Join(ws, "main"), 0o755)
	git(t, filepath.Join(ws, "main"), "init", "-q")
	// A worktree-style .git file pointing to a git dir inside the root, and
	// one pointing outside it (not ours to protect).
	os.MkdirAll(filepath.Join(ws, "main/.git/worktrees/wt"), 0o700)
	os.MkdirAll(filepath.Join(ws, "wt"), 0o700)
	os.WriteFile(filepath.Join(ws, "wt/.git"), []byte("gitdir: ../main/.git/worktrees/wt\n"), 0o600)
	os.MkdirAll(filepath.Join(ws, "abs"), 0o700)
	os.WriteFile(filepath.Join(ws, "abs/.git"), []byte("gitdir: "+ws+"/main/.git/worktrees/wt\n"), 0o600)
	os.MkdirAll(filepath.Join(ws, "other"), 0o700)
	os.WriteFile(filepath.Join(ws, "other/.git"), []byte("gitdir: /elsewhere/.git\n"), 0o600)
	got, err := findGitDirs(Root{Host: ws, Dir: openDir(t, ws)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"main/.git": true, "main/.git/worktrees/wt": true}
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

// TestFindGitDirsSkipsProtectedNames: a repository beneath a protected name
// (read-only with it) is not looked for; one beneath .claude, which is only
// the parent of protected names, is.
func TestFindGitDirsSkipsProtectedNames(t *testing.T) {
	ws := t.TempDir()
	for _, dir := range []string{".vscode/x", ".claude/agents/y", ".claude/z", ".bashrc/w"} {
		os.MkdirAll(filepath.Join(ws, dir), 0o755)
		git(t, filepath.Join(ws, dir), "init", "-q")
	}
	got, err := findGitDirs(Root{Host: ws, Dir: openDir(t, ws)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != ".claude/z/.git" {
		t.Errorf("found %q, want only .claude/z/.git", got)
	}
}

func TestLedgerKeepsPlaceholdersWhileAnotherRunLives(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxes.json")
	ws := t.TempDir()
	os.Mkdir(filepath.Join(ws, ".mcp.json"), 0o755)
	ph := placeholder{Root: ws, Rel: ".mcp.json"}
	parentStart, _ := procstat.StartTime(os.Getppid())
	other := ledgerRun{PID: os.Getppid(), StartTime: parentStart} // alive: stands for another boundary
	dead := ledgerRun{PID: 1 << 22, StartTime: 1}                 // no such process

	l, err := openLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	l.write(&ledgerData{Runs: []ledgerRun{self(), other, dead}, Placeholders: []placeholder{ph}})
	l.close()
	releaseRun(path)
	if _, err := os.Stat(filepath.Join(ws, ".mcp.json")); err != nil {
		t.Fatalf("placeholder removed while another run lives: %v", err)
	}
	l, _ = openLedger(path)
	d, _ := l.read()
	l.close()
	if len(d.Runs) != 1 || d.Runs[0] != other {
		t.Errorf("runs after release = %+v, want only the other (self left, the dead one pruned)", d.Runs)
	}

	// The last run to end removes the placeholders.
	l, _ = openLedger(path)
	l.write(&ledgerData{Runs: []ledgerRun{self()}, Placeholders: []placeholder{ph}})
	l.close()
	releaseRun(path)
	if _, err := os.Stat(filepath.Join(ws, ".mcp.json")); !os.IsNotExist(err) {
		t.Errorf("placeholder still there after the last run ended: %v", err)
	}
}

func TestLedgerReadsTheOldFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxes.json")
	start, _ := procstat.StartTime(os.Getpid())
	old := `{"runs":[{"pid":` + strconv.Itoa(os.Getpid()) + `,"startTime":` + strconv.FormatUint(start, 10) + `}],"placeholders":["/w/.mcp.json"]}`
	os.WriteFile(path, []byte(old), 0o600)
	l, err := openLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	d, err := l.read()
	l.close()
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Runs) != 1 || len(d.Placeholders) != 1 || d.Placeholders[0] != (placeholder{Root: "/w", Rel: ".mcp.json"}) {
		t.Errorf("old ledger read as %+v", d)
	}
}

func TestRemovePlaceholdersKeepsWhatIsNotEmpty(t *testing.T) {
	ws := t.TempDir()
	os.Mkdir(filepath.Join(ws, ".vscode"), 0o755)
	os.WriteFile(filepath.Join(ws, ".vscode", "tasks.json"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(ws, ".bashrc"), []byte("echo hi\n"), 0o644)
	// A symlink put where a placeholder's parent was: nothing beyond it goes.
	outside := t.TempDir()
	os.Mkdir(filepath.Join(outside, "x"), 0o755)
	os.Symlink(outside, filepath.Join(ws, ".claude"))
	removePlaceholders([]placeholder{{ws, ".vscode"}, {ws, ".bashrc"}, {ws, ".claude/x"}})
	for _, p := range []string{filepath.Join(ws, ".vscode"), filepath.Join(ws, ".bashrc"), filepath.Join(outside, "x")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
}

// runVerify applies plan's binds with a real bwrap and runs Verify inside,
// as a boundary does; it returns Verify's error text, or "".
func runVerify(t *testing.T, p *Plan) string {
	t.Helper()
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		t.Skip("bwrap is not installed (make deps installs it)")
	}
	checks, err := ChecksFile(p.Checks())
	if err != nil {
		t.Fatal(err)
	}
	defer checks.Close()
	args := []string{"--unshare-user", "--dev-bind", "/", "/"}
	files := []*os.File{checks}
	for _, r := range p.Roots {
		for _, b := range r.Binds {
			op := "--bind-fd"
			if b.ReadOnly {
				op = "--ro-bind-fd"
			}
			files = append(files, b.File)
			args = append(args, op, strconv.Itoa(3+len(files)-1), b.Target)
		}
	}
	exe, _ := os.Executable()
	cmd := exec.Command(bwrap, append(args, "--", exe)...)
	cmd.ExtraFiles = files
	cmd.Env = append(os.Environ(), "PROTECT_TEST_VERIFY=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		if len(out) == 0 {
			t.Fatalf("bwrap: %v", err)
		}
		return string(out)
	}
	return ""
}

func TestVerifyPassesAnIntactBoundary(t *testing.T) {
	_, p := repoPlan(t)
	if msg := runVerify(t, p); msg != "" {
		t.Errorf("Verify of an intact boundary: %s", msg)
	}
}

func TestVerifyCatchesASwapDuringSetup(t *testing.T) {
	ws := t.TempDir()
	os.Mkdir(filepath.Join(ws, "sub"), 0o755)
	git(t, filepath.Join(ws, "sub"), "init", "-q")
	p, err := prepare(t, ws, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	// What a concurrent session of the same agent can do between the scan
	// and the mounts: move the repository away and put a symlink to a decoy
	// in its place. The binds then land on the decoy, and the real hooks
	// would stay writable at their new path.
	os.Rename(filepath.Join(ws, "sub"), filepath.Join(ws, "moved"))
	os.MkdirAll(filepath.Join(ws, "decoy", ".git", "hooks"), 0o755)
	os.WriteFile(filepath.Join(ws, "decoy", ".git", "config"), nil, 0o644)
	os.Symlink("decoy", filepath.Join(ws, "sub"))
	// bwrap refuses to bind sub's pin onto the symlink, or Verify finds
	// the binds elsewhere: either stops the start.
	msg := runVerify(t, p)
	if !strings.Contains(msg, "changed while the boundary was set up") && !strings.Contains(msg, "bwrap: Race condition binding dirfd") {
		t.Errorf("Verify after a swap = %q, want it to stop the start", msg)
	}
}

func TestAuditReportsWhatARunPlanted(t *testing.T) {
	ws, p := repoPlan(t)
	// During the run: a new repository with a hook, a sample, settings.
	os.Mkdir(filepath.Join(ws, "new"), 0o755)
	git(t, filepath.Join(ws, "new"), "init", "-q")
	git(t, filepath.Join(ws, "new"), "remote", "add", "origin", "https://example.com/r.git")
	git(t, filepath.Join(ws, "new"), "config", "core.fsmonitor", "touch /tmp/pwned")
	git(t, filepath.Join(ws, "new"), "config", "alias.st", "!sh -c id")
	os.WriteFile(filepath.Join(ws, "new", ".git", "hooks", "pre-commit"), []byte("#!/bin/sh\n"), 0o755)
	got := map[string]string{}
	for _, f := range p.Audit() {
		got[f.Path] = f.Reason
	}
	hook := filepath.Join(ws, "new/.git/hooks/pre-commit")
	if !strings.Contains(got[hook], "git hook") {
		t.Errorf("audit %v lacks the planted hook %s", got, hook)
	}
	cfg := got[filepath.Join(ws, "new/.git/config")]
	if !strings.Contains(cfg, "core.fsmonitor") || !strings.Contains(cfg, "alias.st") || strings.Contains(cfg, "remote") {
		t.Errorf("audit of the new config = %q, want core.fsmonitor and alias.st and no remote settings", cfg)
	}
	if len(got) != 2 {
		t.Errorf("audit = %v, want exactly the hook and the config (no samples, nothing of the protected repository)", got)
	}
}

func TestConfigKeys(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"[core]\n\tbare = false\n", "core.bare"},
		{"[remote \"origin\"]\n\turl = x\n", "remote.*.url"},
		{"[Core]\nHooksPath=/x\n", "core.hookspath"},
		{"[branch.main]\nremote = o\n", "branch.*.remote"},
		{"[core] fsmonitor = x\n", "core.fsmonitor"},
		{"# c\n; c\n\n[user]\nname\n", "user.name"},
		{"stray = 1\n", `unreadable line "stray = 1"`},
		{"[core\nx=1\n", `unreadable line "[core", unreadable line "x=1"`},
	} {
		if got := strings.Join(configKeys(strings.NewReader(tc.in)), ", "); got != tc.want {
			t.Errorf("configKeys(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The checks travel as JSON through a memfd.
func TestChecksFileRoundTrip(t *testing.T) {
	want := []Check{{Root: "/w", Rel: ".git/hooks", Dev: 1, Ino: 2, ReadOnly: true}}
	f, err := ChecksFile(want)
	if err != nil {
		t.Fatal(err)
	}
	fd, _ := unix.Dup(int(f.Fd()))
	f.Close()
	got, err := ReadChecks(fd)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(want)
	if string(a) != string(b) {
		t.Errorf("checks = %s, want %s", a, b)
	}
}

// TestStaleSeesANewRepository: a plan made before a repository appeared in
// its root protects less than one made now (a warm boundary is then built
// again); files that are not repositories change nothing.
func TestStaleSeesANewRepository(t *testing.T) {
	ws, p := repoPlan(t)
	if stale, err := p.Stale(); stale || err != nil {
		t.Fatalf("Stale right after Prepare = %v, %v; want false", stale, err)
	}
	os.WriteFile(filepath.Join(ws, "notes.txt"), []byte("x"), 0o644)
	os.MkdirAll(filepath.Join(ws, "src", "pkg"), 0o755)
	if stale, err := p.Stale(); stale || err != nil {
		t.Fatalf("Stale after plain files = %v, %v; want false", stale, err)
	}
	git(t, filepath.Join(ws, "src", "pkg"), "init", "-q")
	if stale, err := p.Stale(); !stale || err != nil {
		t.Fatalf("Stale after git init in src/pkg = %v, %v; want true", stale, err)
	}
}

// TestFindGitDirsBounds: the scan looks for a .git three levels down and no
// deeper, not beneath node_modules, not through a symlinked directory, takes
// a .git that is neither a directory nor a file for none, and
// stops after scanMaxDirs directories in name order.
func TestFindGitDirsBounds(t *testing.T) {
	ws := t.TempDir()
	for _, dir := range []string{"a/.git", "a/b/.git", "a/b/c/.git", "a/b/c/d/.git", "node_modules/x/.git", "elsewhere/r/.git"} {
		if err := os.MkdirAll(filepath.Join(ws, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(ws, "elsewhere/r"), filepath.Join(ws, "a/link")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(ws, "f"), 0o755)
	if err := unix.Mkfifo(filepath.Join(ws, "f/.git"), 0o600); err != nil { // neither a git dir nor a .git file
		t.Fatal(err)
	}
	got, err := findGitDirs(Root{Host: ws, Dir: openDir(t, ws)})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"a/.git", "a/b/.git", "a/b/c/.git", "elsewhere/r/.git"}; !slices.Equal(got, want) {
		t.Errorf("found %q, want %q", got, want)
	}

	// The root is the first directory visited; its entries follow in name
	// order, so of n0001..n5000 the last is not looked at.
	many := t.TempDir()
	for i := 1; i <= scanMaxDirs; i++ {
		if err := os.Mkdir(filepath.Join(many, fmt.Sprintf("n%04d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"n0001/.git", fmt.Sprintf("n%04d/.git", scanMaxDirs-1), fmt.Sprintf("n%04d/.git", scanMaxDirs)} {
		if err := os.Mkdir(filepath.Join(many, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got, err = findGitDirs(Root{Host: many, Dir: openDir(t, many)})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []string{"n0001/.git", fmt.Sprintf("n%04d/.git", scanMaxDirs-1)}; !slices.Equal(got, want) {
		t.Errorf("with %d directories found %q, want %q", scanMaxDirs, got, want)
	}
}
