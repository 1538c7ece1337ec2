package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/testdns"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmnet"
)

// batteryFuncs are the verdicts of a battery line: deny NAME CMD prints
// "held NAME" when CMD fails (an attempt that must fail), allow NAME CMD
// prints "works NAME" when it succeeds (a positive control); ESCAPED and
// BROKEN when either does the opposite.
const batteryFuncs = `
deny() { n=$1; shift; if "$@" >/dev/null 2>&1; then echo "ESCAPED $n"; else echo "held $n"; fi; }
allow() { n=$1; shift; if "$@" >/dev/null 2>&1; then echo "works $n"; else echo "BROKEN $n"; fi; }
`

// rootsBattery attacks the writable roots beyond a repository the host made
// at the workspace's root: a workspace with no repository (the daemon gives
// it one before the session, so git init there cannot make an unprotected
// one), a repository the host made nested in it (proj), and an extra rw
// mount holding a repository (/work, protected by its source). srt and
// microsandbox run it alike.
const rootsBattery = `
deny root-init-hook sh -c 'git init -q . ; echo "#!/bin/sh" > .git/hooks/pre-commit'
deny root-hook-dir sh -c 'rm -rf .git/hooks; mkdir -p .git/hooks && echo x > .git/hooks/pre-commit'
deny root-config sh -c 'echo "[core]" >> .git/config'
deny root-config-by-git git config core.fsmonitor 'touch /tmp/pwned'
deny root-commondir sh -c 'echo /tmp/elsewhere > .git/commondir'
deny root-config-worktree sh -c 'echo "[core]" > .git/config.worktree'
deny root-mv-git sh -c 'mv .git .git2 && mkdir -p .git/hooks && echo x > .git/hooks/pre-commit'
deny nested-hook sh -c 'echo x > proj/.git/hooks/pre-commit'
deny nested-config-by-git git -C proj config core.hooksPath /tmp
deny nested-hardlink ln proj/.git/config cfglink
deny nested-mv sh -c 'mv proj/.git proj/.git2 && mkdir -p proj/.git/hooks && echo x > proj/.git/hooks/pre-commit'
deny mount-hook sh -c 'echo x > /work/.git/hooks/pre-commit'
deny mount-config sh -c 'echo x >> /work/.git/config'
deny mount-bashrc sh -c 'echo x > /work/.bashrc'
deny mount-mcp sh -c 'echo {} > /work/.mcp.json'
deny mount-mv-git sh -c 'mv /work/.git /work/.git2 && mkdir -p /work/.git/hooks && echo x > /work/.git/hooks/pre-commit'
deny gitdir-vscode sh -c 'echo x > .vscode/tasks.json'
deny gitdir-claude sh -c 'mkdir -p .claude/commands && echo x > .claude/commands/c.md'
deny gitdir-in-home sh -c 'echo x > ../home/node_modules/r.git/hooks/pre-commit'
deny nested-mv-parent sh -c 'mv proj proj2 && git init -q proj && echo x > proj/.git/hooks/pre-commit'
deny mount-submodule-slash sh -c 'echo x > /work/.git/modules/libs/foo/hooks/post-checkout'
deny mount-claude-settings sh -c 'echo "{\"hooks\":{}}" > /work/.claude/settings.json'
deny claude-settings-local sh -c 'rm -rf .claude/settings.local.json; echo "{\"hooks\":{}}" > .claude/settings.local.json'
deny claude-mv-parent sh -c 'mv .claude claude2 && mkdir -p .claude/commands && echo x > .claude/commands/c.md'
allow root-git-work sh -c 'echo a > a.txt && git add a.txt && git -c user.name=t -c user.email=t@t commit -qm root-commit && git branch b2 && git log --oneline | grep -q root-commit'
allow nested-git-work sh -c 'cd proj && echo b > b.txt && git add b.txt && git -c user.name=t -c user.email=t@t commit -qm nested-commit'
allow mount-write sh -c 'echo m > /work/m.txt'
allow sub-git-init sh -c 'mkdir sub && cd sub && git init -q && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m x'
allow sub-plant sh -c 'printf "#!/bin/sh\n" > sub/.git/hooks/pre-commit && git -C sub config core.fsmonitor "touch /tmp/pwned"'
`

// vmBattery is what a microsandbox session must not reach beyond the roots:
// the host's files that were not shared, the protected names of the home
// and workspace, the host's loopback without an entry, private and metadata
// addresses, a name resolving to loopback.
const vmBattery = `
conn() { timeout 8 bash -c "exec 3<>/dev/tcp/$1/$2 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -c 16 <&3 | grep -q ."; }
deny daemon-home ls "$T_DAEMON_HOME/sessions"
deny daemon-config cat "$T_DAEMON_HOME/config.json"
deny other-agent cat "$T_OTHER_WS/secret.txt"
deny host-tmp cat "$T_HOST_TMP"
deny home-bashrc sh -c 'echo x >> "$HOME/.bashrc"'
deny home-profile sh -c 'echo x > "$HOME/.profile"'
deny home-gitconfig sh -c 'echo "[alias]" > "$HOME/.gitconfig"'
deny ws-bashrc sh -c 'echo x > .bashrc'
deny ws-mcp sh -c 'echo {} > .mcp.json'
deny ws-vscode sh -c 'mkdir -p .vscode && echo x > .vscode/tasks.json'
deny ws-vscode-swap sh -c 'rm -rf .vscode && ln -s /tmp .vscode'
deny claude-agents sh -c 'mkdir -p .claude/agents && echo x > .claude/agents/x.md'
deny host-loopback conn ` + vmnet.HostIP + ` "$T_LOOPBACK_PORT"
deny private-ip conn "$T_PRIVATE_IP" "$T_PUBLIC_PORT"
deny metadata conn 169.254.169.254 80
deny loopback-name conn loop.test "$T_LOOPBACK_PORT"
allow public-ip conn "$T_PUBLIC_IP" "$T_PUBLIC_PORT"
allow write-home sh -c 'echo x > "$HOME/home.txt"'
allow write-tmp sh -c 'echo x > /tmp/t && echo x > "$TMPDIR/t"'
`

// rootsEnv is a roots battery's setup: a workspace without a repository
// (but a repository nested in it) and an rw mount holding one, both made
// on the host before the session; and .git files an earlier session could
// have left in the workspace, naming as their git directories a protected
// name (.vscode), a directory above protected names (.claude) and one in
// home below where home's own scan looks.
type rootsEnv struct {
	home, ws, mount string
	before          map[string][]byte // protected files as the host made them
}

func setupRoots(t *testing.T, home, strategy, script string, extra ...string) rootsEnv {
	t.Helper()
	mount := t.TempDir()
	gitHost(t, mount, "init", "-q")
	// A submodule's git directory at its name, libs/foo, with no worktree
	// naming it (`git submodule update` finds it there).
	// An empty hooks in libs, a part of its name, must not hide it.
	gitHost(t, mount, "init", "-q", "--bare", filepath.Join(mount, ".git/modules/libs/foo"))
	os.Mkdir(filepath.Join(mount, ".git/modules/libs/hooks"), 0o755)
	args := append([]string{"agent", "create", "box", "--strategy", strategy, "--mount", mount + ":/work:rw"}, extra...)
	ok(t, home, append(args, "--", "sh", "-c", script)...)
	e := rootsEnv{home: home, ws: filepath.Join(agentDir(t, home, "box"), "workspace"), mount: mount, before: map[string][]byte{}}
	os.MkdirAll(filepath.Join(e.ws, "proj"), 0o755)
	gitHost(t, filepath.Join(e.ws, "proj"), "init", "-q")
	agentHome := filepath.Join(agentDir(t, home, "box"), "home")
	for _, d := range []string{filepath.Join(agentHome, "node_modules/r.git"), filepath.Join(e.ws, ".vscode"), filepath.Join(e.ws, ".claude")} {
		os.MkdirAll(d, 0o755)
	}
	for dir, gitdir := range map[string]string{"vsc": "../.vscode", "cl": "../.claude", "xr": agentHome + "/node_modules/r.git"} {
		os.MkdirAll(filepath.Join(e.ws, dir), 0o755)
		if err := os.WriteFile(filepath.Join(e.ws, dir, ".git"), []byte("gitdir: "+gitdir+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Claude Code runs the hooks of a project's settings.
	settings := filepath.Join(mount, ".claude/settings.json")
	os.MkdirAll(filepath.Dir(settings), 0o755)
	if err := os.WriteFile(settings, []byte(`{"permissions":{}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(e.ws, "proj/.git/config"), filepath.Join(mount, ".git/config"), settings} {
		e.before[p], _ = os.ReadFile(p)
	}
	return e
}

func gitHost(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*", "-C", dir}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v in %s: %v: %s", args, dir, err, out)
	}
	return string(out)
}

// verdicts checks a battery's output: every deny line held, every allow
// line worked.
func verdicts(t *testing.T, script, out string) {
	t.Helper()
	held, works := 0, 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		verdict, name, _ := strings.Cut(sc.Text(), " ")
		switch verdict {
		case "held":
			held++
		case "works":
			works++
		case "ESCAPED":
			t.Errorf("escape attempt %s succeeded", name)
		case "BROKEN":
			t.Errorf("positive control %s failed", name)
		}
	}
	if want := strings.Count(script, "\ndeny "); held != want {
		t.Errorf("%d escape attempts held, want %d:\n%s", held, want, out)
	}
	if want := strings.Count(script, "\nallow "); works != want {
		t.Errorf("%d positive controls worked, want %d:\n%s", works, want, out)
	}
	t.Logf("%d escape attempts held, %d positive controls worked", held, works)
}

// checkHost looks at the roots from the host after the session: what the
// battery attempted is not there, what it was allowed to do is, and what it
// planted in the repository it created (sub) is reported, in session show
// and as events.
func (e rootsEnv) checkHost(t *testing.T, id string) {
	t.Helper()
	var shown struct {
		Violations []struct {
			Protocol string `json:"protocol"`
			Host     string `json:"host"`
			Reason   string `json:"reason"`
		} `json:"violations"`
	}
	okJSON(t, e.home, &shown, "session", "show", id)
	files := map[string]string{}
	for _, v := range shown.Violations {
		if v.Protocol == "file" {
			files[v.Host] = v.Reason
		}
	}
	hook, cfg := filepath.Join(e.ws, "sub/.git/hooks/pre-commit"), filepath.Join(e.ws, "sub/.git/config")
	if !strings.Contains(files[hook], "git hook written during the session") || !strings.Contains(files[cfg], "core.fsmonitor") || len(files) != 2 {
		t.Errorf("file violations = %v, want the planted hook %s and the fsmonitor in %s, nothing else", files, hook, cfg)
	}
	if events := ok(t, e.home, "events", "--json"); !strings.Contains(events, "file "+hook+": git hook written") {
		t.Errorf("no session.violation event for %s:\n%s", hook, events)
	}
	if fi, err := os.Stat(filepath.Join(e.ws, ".git")); err != nil || !fi.IsDir() {
		t.Fatalf("the workspace has no repository of the daemon's: %v", err)
	}
	if log := gitHost(t, e.ws, "log", "--oneline"); !strings.Contains(log, "root-commit") {
		t.Errorf("the workspace's repository lacks the session's commit: %q", log)
	}
	if log := gitHost(t, filepath.Join(e.ws, "proj"), "log", "--oneline"); !strings.Contains(log, "nested-commit") {
		t.Errorf("the nested repository lacks the session's commit: %q", log)
	}
	for _, p := range []string{
		filepath.Join(e.ws, ".git/hooks/pre-commit"), filepath.Join(e.ws, ".git2"), filepath.Join(e.ws, "cfglink"),
		filepath.Join(e.ws, "proj/.git/hooks/pre-commit"), filepath.Join(e.ws, "proj/.git2"), filepath.Join(e.ws, "proj2"), filepath.Join(e.ws, "claude2"),
		filepath.Join(e.mount, ".git/hooks/pre-commit"), filepath.Join(e.mount, ".git2"), filepath.Join(e.mount, ".git/modules/libs/foo/hooks/post-checkout"),
		filepath.Join(e.ws, ".vscode/tasks.json"), filepath.Join(e.ws, ".claude/commands/c.md"),
		filepath.Join(e.ws, "../home/node_modules/r.git/hooks/pre-commit"),
	} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists on the host after the session", p)
		}
	}
	// The placeholders go just after the exit is reported.
	// (A settings file the runtime wrote instead would stay.)
	for _, p := range []string{filepath.Join(e.mount, ".bashrc"), filepath.Join(e.mount, ".mcp.json"), filepath.Join(e.ws, ".bashrc"), filepath.Join(e.ws, ".claude/settings.local.json")} {
		eventually(t, 10*time.Second, "placeholder "+p+" is removed", func() bool {
			_, err := os.Lstat(p)
			return os.IsNotExist(err)
		})
	}
	for p, b := range e.before {
		if now, _ := os.ReadFile(p); !bytes.Equal(now, b) {
			t.Errorf("%s changed during the session:\n%s\nwas:\n%s", p, now, b)
		}
	}
	if cfg, _ := os.ReadFile(filepath.Join(e.ws, ".git/config")); strings.Contains(string(cfg), "fsmonitor") {
		t.Errorf("the workspace's config was written: %s", cfg)
	}
	if _, err := os.ReadFile(filepath.Join(e.mount, "m.txt")); err != nil {
		t.Errorf("the rw mount was not written through: %v", err)
	}
}

func TestSRTRootsBattery(t *testing.T) {
	requireRoot(t)
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	e := setupRoots(t, home, "srt", batteryFuncs+rootsBattery+"echo done\n")
	r := run(t, home, "", "exec", "--keep", "box")
	if r.code != 0 {
		t.Fatalf("battery: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	verdicts(t, rootsBattery, r.stdout)
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls")
	if len(sessions) != 1 {
		t.Fatalf("sessions after exec --keep: %+v", sessions)
	}
	e.checkHost(t, sessions[0].ID)
}

func TestMicrosandboxBattery(t *testing.T) {
	requireMicrosandbox(t)
	startPublicNet(t)
	loopback := loopbackServer(t, "loopback")
	dns := testdns.Start(t, map[string][]netip.Addr{"loop.test": {netip.MustParseAddr("127.0.0.1")}})
	h, _ := startVMDaemon(t, `, "resolver": "`+dns+`"`)
	ok(t, h, "agent", "create", "other", "--strategy", "microsandbox", "--", "true")
	otherWS := filepath.Join(agentDir(t, h, "other"), "workspace")
	os.WriteFile(filepath.Join(otherWS, "secret.txt"), []byte("secret\n"), 0o644)
	hostTmp := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(hostTmp, []byte("host secret\n"), 0o644)
	script := batteryFuncs + rootsBattery + vmBattery + "echo done\n"
	e := setupRoots(t, h, "microsandbox", script,
		"--env", "T_DAEMON_HOME="+h, "--env", "T_OTHER_WS="+otherWS, "--env", "T_HOST_TMP="+hostTmp,
		"--env", fmt.Sprintf("T_LOOPBACK_PORT=%d", loopback), "--env", "T_PRIVATE_IP="+privateServerIP,
		"--env", "T_PUBLIC_IP="+publicServerIP, "--env", fmt.Sprintf("T_PUBLIC_PORT=%d", publicPort))
	id, out := startAndWait(t, h, "box", "")
	verdicts(t, rootsBattery+vmBattery, out)
	e.checkHost(t, id)
}
