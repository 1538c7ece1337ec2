package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

func requireBwrap(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap is not installed (make deps installs it)")
	}
}

// agentDir returns the directory of the agent called name.
func agentDir(t testing.TB, home, name string) string {
	t.Helper()
	var a struct{ Dir string }
	okJSON(t, home, &a, "agent", "show", name)
	return a.Dir
}

// runAs runs a command on the host as uid (0: as the test), for setting up
// files the daemon's user owns.
func runAs(t testing.TB, uid int, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// battery is a shell script run inside an srt session. Each line of its
// output is "held NAME" (an escape attempt failed), "works NAME" (a
// positive control ran), or ESCAPED/BROKEN when one did the opposite.
const battery = batteryFuncs + `
py() { python3 -c "import ctypes,sys,socket,os; libc=ctypes.CDLL(None, use_errno=True); $1"; }
# The fds beyond stdio the runtime (this shell) started with, read before it
# made any redirection of its own (shells keep saved fds at 10 and up).
python3 -c 'import os; open(os.environ["TMPDIR"] + "/fds0", "w").write(" ".join(sorted(set(os.listdir("/proc/%d/fd" % os.getppid())) - {"0", "1", "2"})))'

deny write-usr touch /usr/agentconnect-escape
deny write-etc sh -c 'echo x > /etc/agentconnect-escape'
deny write-root-fs touch /agentconnect-escape
deny read-daemon-home ls "$T_DAEMON_HOME/sessions"
deny read-daemon-secret cat "$T_DAEMON_HOME/secret.txt"
deny read-other-agent cat "$T_OTHER_WS/secret.txt"
deny read-root-home sh -c '[ -n "$(ls -A /root)" ]'
deny read-host-tmp cat "$T_HOST_TMP"
deny symlink-escape sh -c 'ln -s "$T_HOST_TMP" l1 && cat l1'
deny symlink-escape-daemon sh -c 'ln -s "$T_DAEMON_HOME/secret.txt" l2 && cat l2'
deny hardlink-escape ln /etc/hostname hl
deny mknod mknod dev0 c 1 3
deny setuid-copy sh -c 'cp /usr/bin/id ./suid && chmod u+s ./suid && [ "$(./suid -u)" = 0 ] && [ "$(id -u)" != 0 ]'
deny new-privs sh -c 'grep -qE "NoNewPrivs:[[:space:]]+0" /proc/self/status'
deny capabilities sh -c 'grep -E "^CapEff" /proc/self/status | grep -qv "0000000000000000"'
deny unshare-user unshare -U true
deny mount mount -t tmpfs none "$TMPDIR"
deny ptrace-pid1 py 'sys.exit(0 if libc.ptrace(16, 1, 0, 0) == 0 else 1)'
deny write-proc1-mem sh -c 'echo x > /proc/1/mem'
deny host-unix-socket py 's=socket.socket(socket.AF_UNIX); s.connect(os.environ["T_ADMIN_SOCK"])'
deny io-uring py 'p=ctypes.create_string_buffer(120); sys.exit(0 if libc.syscall(425, 8, p) >= 0 else 1)'
deny pidfd-getfd py 'import subprocess; c=subprocess.Popen(["sleep", "5"]); r=libc.syscall(438, os.pidfd_open(c.pid), 0, 0); c.kill(); sys.exit(0 if r >= 0 else 1)'
deny open-by-handle py 'h=ctypes.create_string_buffer(b"\x08\0\0\0\x01\0\0\0\x02" + bytes(7), 16); sys.exit(0 if libc.open_by_handle_at(os.open("/usr", os.O_RDONLY), h, 0) >= 0 else 1)'
deny kcmp py 'sys.exit(0 if libc.syscall(312, os.getpid(), os.getpid(), 0, 0, 0) == 0 else 1)'
deny many-pids sh -c '[ $(ls /proc | grep -cE "^[0-9]+$") -gt 8 ]'
deny git-hook-write sh -c 'echo "#!/bin/sh" > .git/hooks/pre-commit'
deny git-hook-create sh -c 'echo "#!/bin/sh" > .git/hooks/post-checkout'
deny git-config-write sh -c 'echo "[core]" >> .git/config'
deny git-config-by-git git config core.fsmonitor 'touch /tmp/pwned'
deny git-mv-escape sh -c 'mv .git .git2 && mkdir -p .git/hooks && echo x > .git/hooks/pre-commit'
deny git-hooks-umount sh -c 'umount .git/hooks || umount -l .git/hooks; echo x > .git/hooks/pre-commit'
deny git-rename-hooks mv .git/hooks .git/hooks2
deny home-gitconfig sh -c 'echo "[alias]" > "$HOME/.gitconfig"'
deny home-bashrc sh -c 'echo x >> "$HOME/.bashrc"'
deny workspace-mcp sh -c 'echo {} > .mcp.json'
deny workspace-vscode sh -c 'mkdir -p .vscode && echo x > .vscode/tasks.json'
deny claude-commands sh -c 'mkdir -p .claude/commands && echo x > .claude/commands/x.md'
deny loopback-direct py 'socket.create_connection(("127.0.0.1", int(os.environ["T_LOOPBACK_PORT"])), 2)'
deny loopback-via-proxy curl -sf --max-time 5 --noproxy '' -x "$HTTP_PROXY" "http://127.0.0.1:$T_LOOPBACK_PORT/"
deny dns getent hosts example.com
deny dns-python py 'socket.getaddrinfo("example.com", 80)'
deny read-agent-json cat "$(dirname "$HOME")/agent.json"
deny unexpected-env sh -c 'env | cut -d= -f1 | grep -vqE "^(HOME|TMPDIR|PATH|LANG|TERM|PWD|OLDPWD|SHLVL|_|(HTTPS?|ALL|NO)_PROXY|(https?|all|no)_proxy|T_[A-Z_]+)$"'
deny daemon-secret-env sh -c 'cat /proc/*/environ 2>/dev/null | tr "\0" "\n" | grep -q "$T_SECRET_A$T_SECRET_B"'
deny inherited-fds test -s "$TMPDIR/fds0"

allow write-workspace sh -c 'echo x > ws.txt'
allow write-home sh -c 'echo x > "$HOME/home.txt"'
allow write-tmp sh -c 'echo x > /tmp/t && echo x > "$TMPDIR/t"'
allow git-work sh -c 'echo a > a.txt && git add a.txt && git -c user.name=t -c user.email=t@t commit -qm a && git branch b2 && git log --oneline | grep -q a && git status --porcelain | grep -vq .mcp.json'
allow git-init-elsewhere sh -c 'mkdir sub && cd sub && git init -q && git -c user.name=t -c user.email=t@t commit -q --allow-empty -m x'
allow af-unix py 's=socket.socket(socket.AF_UNIX); s.bind("u.sock"); s.listen(); c=socket.socket(socket.AF_UNIX); c.connect("u.sock")'
allow node node -e 'console.log(1+1)'
allow python python3 -c 'print(2)'
allow node-child-process node -e "require('child_process').execSync('true')"
allow background sh -c 'sleep 30 & p=$!; sleep 0.3; kill -0 $p'
allow read-system cat /etc/hostname
echo done
`

// batteryEnv runs a battery session's setup: a repository in the agent's
// workspace, a secret in the daemon's home and in another agent's
// workspace, a file in the host's /tmp and a loopback server on the host.
type batteryEnv struct {
	home, ws, hostTmp, otherWS string
	loopbackPort               int
}

func setupBattery(t *testing.T, home string, uid int, strategy, script string) batteryEnv {
	t.Helper()
	ok(t, home, "agent", "create", "box", "--strategy", strategy, "--", "sh", "-c", script)
	ok(t, home, "agent", "create", "other", "--strategy", strategy, "--", "true")
	e := batteryEnv{home: home, ws: filepath.Join(agentDir(t, home, "box"), "workspace")}
	e.otherWS = filepath.Join(agentDir(t, home, "other"), "workspace")
	runAs(t, uid, "git", "init", "-q", e.ws)
	runAs(t, uid, "sh", "-c", "echo secret > "+e.otherWS+"/secret.txt")
	os.WriteFile(filepath.Join(home, "secret.txt"), []byte("secret\n"), 0o644)
	tmp, err := os.CreateTemp("", "agentconnect-host-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	tmp.WriteString("host secret\n")
	tmp.Close()
	os.Chmod(tmp.Name(), 0o644)
	t.Cleanup(func() { os.Remove(tmp.Name()) })
	e.hostTmp = tmp.Name()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "loopback") }))
	t.Cleanup(srv.Close)
	e.loopbackPort = srv.Listener.Addr().(*net.TCPAddr).Port
	return e
}

func (e batteryEnv) run(t *testing.T) {
	t.Helper()
	verdicts(t, battery, e.exec(t))
	// The placeholders are gone after the run: the repository is as it was.
	gitOut, err := exec.Command("git", "-c", "safe.directory=*", "-C", e.ws, "status", "--porcelain", "--ignored").CombinedOutput()
	if err != nil || strings.Contains(string(gitOut), ".mcp.json") || strings.Contains(string(gitOut), ".bashrc") {
		t.Errorf("workspace after the run: %s %v", gitOut, err)
	}
	// The shim removes them just after it reports the exit.
	for _, p := range []string{".mcp.json", ".vscode", ".idea", ".bashrc"} {
		eventually(t, 5*time.Second, "placeholder "+p+" is removed", func() bool {
			_, err := os.Lstat(filepath.Join(e.ws, p))
			return os.IsNotExist(err)
		})
	}
}

// run2 expects every attempt of a partial battery to escape (the control
// without a boundary).
func (e batteryEnv) run2(t *testing.T, attempts int) {
	t.Helper()
	out := e.exec(t)
	if got := strings.Count(out, "ESCAPED "); got != attempts {
		t.Errorf("on the host %d of %d attempts escaped, want all:\n%s", got, attempts, out)
	}
}

// exec runs the agent "box" (the battery) with the battery's environment
// and returns its output.
func (e batteryEnv) exec(t *testing.T) string {
	t.Helper()
	ok(t, e.home, "agent", "edit", "box",
		"--env", "T_DAEMON_HOME="+e.home, "--env", "T_OTHER_WS="+e.otherWS, "--env", "T_HOST_TMP="+e.hostTmp,
		"--env", "T_ADMIN_SOCK="+filepath.Join(e.home, "run", "agentconnect.sock"),
		"--env", fmt.Sprintf("T_LOOPBACK_PORT=%d", e.loopbackPort), "--env", "T_SECRET_A="+daemonSecret[:10], "--env", "T_SECRET_B="+daemonSecret[10:])
	r := run(t, e.home, "", "exec", "box")
	if r.code != 0 {
		t.Fatalf("battery: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// daemonSecret is in the environment of the daemons these tests start: no
// sandbox may see it.
const daemonSecret = "agentconnect-test-secret-5f1d"

func TestSRTEscapeBatteryAsRoot(t *testing.T) {
	requireRoot(t)
	requireBwrap(t)
	home := newHome(t)
	t.Setenv("AGENTCONNECT_TEST_SECRET", daemonSecret)
	startDaemon(t, home)
	setupBattery(t, home, 0, "srt", battery).run(t)
	checkGracefulStop(t, home)
}

// checkGracefulStop: session stop's SIGTERM reaches the runtime inside the
// sandbox (not bwrap, which would die of it and take the runtime along).
func checkGracefulStop(t *testing.T, home string) {
	t.Helper()
	ok(t, home, "agent", "create", "graceful", "--strategy", "srt", "--", "sh", "-c",
		`trap "echo got TERM; exit 7" TERM; echo ready; while :; do sleep 0.1; done`)
	id := strings.TrimSpace(ok(t, home, "session", "start", "graceful"))
	eventually(t, 10*time.Second, "the runtime is ready", func() bool {
		return strings.Contains(ok(t, home, "session", "logs", id), "ready")
	})
	ok(t, home, "session", "stop", id)
	if s := show(t, home, id); s.ExitCode != 7 || !strings.Contains(ok(t, home, "session", "logs", id), "got TERM") {
		t.Errorf("stopped session: exit %d, want 7 from the runtime's TERM handler", s.ExitCode)
	}
}

func TestSRTEscapeBatteryUnprivileged(t *testing.T) {
	requireRoot(t) // to make the unprivileged daemon's home
	requireBwrap(t)
	home := nobodyHome(t)
	t.Setenv("AGENTCONNECT_TEST_SECRET", daemonSecret)
	d := &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
	d.start()
	t.Cleanup(d.cleanup)
	setupBattery(t, home, nobody, "srt", battery).run(t)
	checkGracefulStop(t, home)
}

func TestSRTSurvivesSupervisorKill(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "counter", "--strategy", "srt", "--", "sh", "-c", counter)
	id := strings.TrimSpace(ok(t, home, "session", "start", "counter"))
	before := show(t, home, id)
	if before.State != "running" || before.Strategy != "srt" {
		t.Fatalf("session: %+v", before)
	}
	time.Sleep(300 * time.Millisecond)
	d.kill9()
	time.Sleep(300 * time.Millisecond)
	d.restart()
	after := show(t, home, id)
	if after.State != "running" || after.PID != before.PID {
		t.Fatalf("after restart: %+v, want running with pid %d", after, before.PID)
	}
	ok(t, home, "session", "stop", id)
	if n := checkCounter(t, "srt session log", ok(t, home, "session", "logs", id)); n < 8 {
		t.Errorf("only %d lines", n)
	}
	if s := show(t, home, id); s.ExitCode != 128+int(syscall.SIGTERM) {
		t.Errorf("stopped srt session: exit %d, want %d (SIGTERM reached the runtime)", s.ExitCode, 128+int(syscall.SIGTERM))
	}
}

func TestSRTTwoSessionsAndAMountAtANewPath(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	tools := t.TempDir()
	os.WriteFile(filepath.Join(tools, "hello"), []byte("#!/bin/sh\necho hello from tools\n"), 0o755)
	target := "/opt/agentconnect-test-tools/bin" // absent on the host
	if _, err := os.Stat(target); err == nil {
		t.Fatalf("%s exists on the host", target)
	}
	ok(t, home, "agent", "create", "tooled", "--strategy", "srt", "--mount", tools+":"+target, "--",
		"sh", "-c", target+"/hello; touch "+target+"/x 2>/dev/null && echo WRITABLE; ls /opt >/dev/null && echo opt-listed; sleep 2")
	a := strings.TrimSpace(ok(t, home, "session", "start", "tooled"))
	b := strings.TrimSpace(ok(t, home, "session", "start", "tooled"))
	for _, id := range []string{a, b} {
		if s := show(t, home, id); s.State != "running" {
			t.Fatalf("session %s: %+v, want both sessions of one agent running", id, s)
		}
	}
	for _, id := range []string{a, b} {
		ok(t, home, "session", "wait", id)
		out := ok(t, home, "session", "logs", id)
		if !strings.Contains(out, "hello from tools") || strings.Contains(out, "WRITABLE") || !strings.Contains(out, "opt-listed") {
			t.Errorf("session %s output %q: want the tool to run, its mount read-only, /opt still there", id, out)
		}
	}
	if _, err := os.Stat(target); err == nil {
		t.Errorf("the sandbox made %s on the host", target)
	}
}

// TestSRTOverlappingSessionsKeepProtection: a session that ends does not
// take away the protections of another session of the same agent, started
// while it ran, that bound its placeholders read-only.
func TestSRTOverlappingSessionsKeepProtection(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "one", "--strategy", "srt", "--", "true")
	a := strings.TrimSpace(ok(t, home, "session", "start", "one", "--", "sleep", "1"))
	time.Sleep(300 * time.Millisecond) // the first sandbox's placeholders exist
	b := strings.TrimSpace(ok(t, home, "session", "start", "one", "--", "sh", "-c", `
sleep 2
try() { if sh -c "$1" 2>/dev/null; then echo "ESCAPED $2"; else echo "held $2"; fi; }
try 'echo {} > .mcp.json' mcp
try 'mkdir -p .vscode && echo x > .vscode/tasks.json' vscode
try 'echo x >> "$HOME/.bashrc"' bashrc
`))
	ok(t, home, "session", "wait", a)
	ok(t, home, "session", "wait", b)
	out := ok(t, home, "session", "logs", b)
	if strings.Contains(out, "ESCAPED") || strings.Count(out, "held") != 3 {
		t.Errorf("the second session after the first ended:\n%s", out)
	}
}

// TestSRTCgroupLimits: the session's cgroup limits apply inside the sandbox.
func TestSRTCgroupLimits(t *testing.T) {
	requireRoot(t)
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "limited", "--strategy", "srt", "--pids", "16", "--memory-mib", "64", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "limited"))
	s := show(t, home, id)
	if got := cgroupFile(t, s.PID, "pids", "pids.max"); got != "16" {
		t.Errorf("the sandboxed runtime's pids.max = %q, want 16", got)
	}
	if got := cgroupFile(t, s.PID, "memory", "memory.limit_in_bytes"); got != fmt.Sprint(64<<20) {
		t.Errorf("the sandboxed runtime's memory limit = %q, want %d", got, 64<<20)
	}
	ok(t, home, "session", "rm", "--force", id)
	ok(t, home, "agent", "create", "forker", "--strategy", "srt", "--pids", "16", "--", "sh", "-c",
		"for i in $(seq 40); do sleep 5 & done; wait")
	if r := run(t, home, "", "exec", "forker"); !strings.Contains(r.stderr, "Cannot fork") {
		t.Errorf("40 forks under pids 16 in srt: stderr %q, want fork failures", r.stderr)
	}
}

func TestSRTShimDeathTakesTheSandbox(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--strategy", "srt", "--", "sh", "-c", "sleep 600 & sleep 600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	s := show(t, home, id)
	st, err := procstat.Read(s.PID)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's processes share the group of bwrap's init inside it.
	eventually(t, 5*time.Second, "the background sleep starts", func() bool { return len(procstat.Group(st.PGID)) >= 3 })
	nsInit, err := procstat.Read(st.PGID)
	if err != nil {
		t.Fatal(err)
	}
	launcher := nsInit.PPID // the outer bwrap, the shim's child
	syscall.Kill(s.ShimPID, syscall.SIGKILL)
	eventually(t, 2*time.Second, "the session becomes lost", func() bool { return show(t, home, id).State == "lost" })
	eventually(t, 5*time.Second, "nothing of the sandbox is left", func() bool {
		return len(procstat.Group(st.PGID)) == 0 && !procstat.Alive(launcher, 0) && !procstat.Alive(nsInit.PID, 0)
	})
}

// TestSRTPlantedSymlinkIsNotFollowed: an agent directory replaced by a
// symlink (by an earlier session, say) stops the start instead of being
// followed out of the agent directory.
func TestSRTPlantedSymlinkIsNotFollowed(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "planted", "--strategy", "srt", "--", "true")
	memory := filepath.Join(agentDir(t, home, "planted"), "memory")
	os.Remove(memory)
	if err := os.Symlink("/etc", memory); err != nil {
		t.Fatal(err)
	}
	r := run(t, home, "", "exec", "--keep", "planted")
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls")
	if r.code != 125 || len(sessions) != 1 || !strings.Contains(sessions[0].Reason, "symlink") {
		t.Errorf("a session with a planted symlink: exit %d, %+v; want 125 and a reason naming the symlink", r.code, sessions)
	}
}

func TestSRTSetupFailureIsReported(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	src := t.TempDir()
	ok(t, home, "agent", "create", "broken", "--strategy", "srt", "--mount", src+":/mnt/data", "--", "true")
	ok(t, home, "agent", "create", "missing", "--strategy", "srt", "--", "no-such-runtime-anywhere")
	if r := run(t, home, "", "exec", "missing"); r.code != 127 || !strings.Contains(r.stderr, "no-such-runtime-anywhere") {
		t.Errorf("exec of a missing command in srt: exit %d, stderr %q; want 127 naming it", r.code, r.stderr)
	}
	ok(t, home, "agent", "create", "notexec", "--strategy", "srt", "--", "/etc/hostname")
	if r := run(t, home, "", "exec", "notexec"); r.code != 126 {
		t.Errorf("exec of a file that is not executable in srt: exit %d, want 126", r.code)
	}
	os.RemoveAll(src) // gone since the agent was saved
	r := run(t, home, "", "exec", "--keep", "broken")
	if r.code != 125 {
		t.Errorf("exec with a missing mount: exit %d, want 125; stderr %q", r.code, r.stderr)
	}
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls")
	if len(sessions) != 1 || sessions[0].ExitCode != -1 || !strings.HasPrefix(sessions[0].Reason, "sandbox setup:") {
		t.Errorf("session: %+v, want exitCode -1 and a reason starting 'sandbox setup:'", sessions)
	}
}

// TestBatteryDetectsEscapes runs some of the battery's attempts on the host
// strategy, which has no boundary: they must succeed there, or the battery
// could not tell a sandbox from none.
func TestBatteryDetectsEscapes(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	names := []string{"read-daemon-secret", "read-host-tmp", "host-unix-socket", "many-pids", "git-hook-write", "workspace-mcp", "loopback-direct"}
	var script strings.Builder
	for _, line := range strings.Split(battery, "\n") {
		keep := strings.HasPrefix(line, "deny() ") || strings.HasPrefix(line, "py() ")
		for _, n := range names {
			keep = keep || strings.HasPrefix(line, "deny "+n+" ")
		}
		if keep {
			script.WriteString(line + "\n")
		}
	}
	setupBattery(t, home, 0, "host", script.String()).run2(t, len(names))
}
