package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sessionfiles "github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// startGroupLeader starts `sleep 600` leading a process group of its own,
// as a session's runtime does, and returns it with its start time.
func startGroupLeader(t *testing.T) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	start, err := procstat.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, start
}

// TestLostSessionSparesReusedPid: a session whose shim died while the
// daemon was down is lost on the next start, and its runtime's process
// group is killed only if the recorded pid is still the recorded process.
// A status.json naming a live pid with another start time (a pid reused
// after a reboot or a long downtime) leaves that process and its group
// alone; one naming it with its own start time (the control) kills it.
func TestLostSessionSparesReusedPid(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--", "sleep", "600")
	var ids []string
	var shims []session
	for i := 0; i < 2; i++ {
		id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
		ids = append(ids, id)
		shims = append(shims, show(t, home, id))
	}
	d.kill9()
	for _, s := range shims {
		start, _ := procstat.StartTime(s.ShimPID)
		if err := procstat.Kill(s.ShimPID, start, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	stranger, strangerStart := startGroupLeader(t)
	runtime, runtimeStart := startGroupLeader(t)
	for i, p := range []struct {
		pid   int
		start uint64
	}{{stranger.Process.Pid, strangerStart + 1}, {runtime.Process.Pid, runtimeStart}} {
		dir := sessionfiles.Dir(filepath.Join(home, "sessions", ids[i]))
		st, err := dir.ReadStatus()
		if err != nil || st == nil {
			t.Fatalf("status.json of %s: %v", ids[i], err)
		}
		st.PID, st.PIDStartTime = p.pid, p.start
		if err := dir.WriteStatus(st); err != nil {
			t.Fatal(err)
		}
	}
	d.restart()
	for _, id := range ids {
		if s := show(t, home, id); s.State != "lost" {
			t.Fatalf("session %s after its shim died: %+v, want lost", id, s)
		}
	}
	// The lost path has run for both: the control shows it signals.
	eventually(t, 10*time.Second, "the recorded runtime (right start time) is killed", func() bool {
		return !procstat.Alive(runtime.Process.Pid, runtimeStart)
	})
	if !procstat.Alive(stranger.Process.Pid, strangerStart) {
		t.Error("the daemon killed a process whose pid a lost session recorded with another start time")
	}
}

// TestAgentRemoveRacesStart races `agent rm` with `session start` of the
// same agent, again and again: whichever wins, there is never a session of
// a removed agent, nor a running session whose agent directory is gone.
// The start used to read the agent, let go of the lock, and register the
// session only once it ran: a removal in between went through.
func TestAgentRemoveRacesStart(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	removedUnderStart := 0
	for i := 0; i < 20; i++ {
		ok(t, home, "agent", "create", "racer", "--", "sleep", "600")
		dir := agentDir(t, home, "racer")
		var start, rm result
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); start = run(t, home, "", "session", "start", "racer") }()
		go func() { defer wg.Done(); rm = run(t, home, "", "agent", "rm", "racer") }()
		wg.Wait()
		var sessions []session
		okJSON(t, home, &sessions, "session", "ls")
		var agents []struct{ Name string }
		okJSON(t, home, &agents, "agent", "ls")
		agentLeft := len(agents) == 1
		if rm.code == 0 == agentLeft {
			t.Fatalf("round %d: agent rm exit %d (%s), agents %+v", i, rm.code, rm.stderr, agents)
		}
		for _, s := range sessions {
			if !agentLeft {
				removedUnderStart++
				t.Errorf("round %d: session %s (%s) of the removed agent (start exit %d, rm exit %d)", i, s.ID, s.State, start.code, rm.code)
			}
			if _, err := os.Stat(dir); s.State == "running" && err != nil {
				t.Errorf("round %d: session %s runs in a removed agent directory: %v", i, s.ID, err)
			}
			run(t, home, "", "session", "rm", "--force", s.ID)
		}
		if agentLeft {
			ok(t, home, "agent", "rm", "racer")
		}
		if start.code != 0 && !strings.Contains(start.stderr, "no agent named") {
			t.Errorf("round %d: session start failed for another reason: %s", i, start.stderr)
		}
		if rm.code != 0 && !strings.Contains(rm.stderr, "starting") && !strings.Contains(rm.stderr, "running") {
			t.Errorf("round %d: agent rm failed for another reason: %s", i, rm.stderr)
		}
	}
	t.Logf("%d sessions outlived their agent", removedUnderStart)
}

// cliAs runs the CLI against the socket as another user.
func cliAs(t *testing.T, cred *syscall.Credential, socket string, args ...string) result {
	t.Helper()
	cmd := exec.Command(agentconnectFor(t, cred), append([]string{"--socket", socket}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("agentconnect %s as uid %d: did not finish", strings.Join(args, " "), cred.Uid)
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// loosen opens the admin socket and the directories above it to everyone,
// as a mistaken chmod (or umask) would.
func loosen(t *testing.T, home string) string {
	t.Helper()
	socket := filepath.Join(home, "run", "agentconnect.sock")
	for p := socket; ; p = filepath.Dir(p) {
		mode := os.FileMode(0o711)
		if p == socket {
			mode = 0o666
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if p == filepath.Dir(home) {
			break
		}
	}
	return socket
}

// TestAdminSocketChecksPeer: the admin socket checks who connects (its peer
// credentials), not only its file mode. With the mode loosened by hand, a
// CLI run as nobody is refused with a clear error and the daemon logs its
// uid and pid; root still gets in. With socketGroup, a member of the group
// by a supplementary group gets in, and a user outside it does not.
func TestAdminSocketChecksPeer(t *testing.T) {
	requireRoot(t)
	nobodyCred := &syscall.Credential{Uid: nobody, Gid: nobody}
	home := newHome(t)
	startDaemon(t, home)
	socket := loosen(t, home)
	r := cliAs(t, nobodyCred, socket, "status")
	if r.code == 0 || !strings.Contains(r.stderr, "permission denied: this daemon accepts admin connections from root only") {
		t.Errorf("status as nobody through a loosened socket: exit %d, stdout %q, stderr %q; want it refused, saying who may connect", r.code, r.stdout, r.stderr)
	}
	r = cliAs(t, nobodyCred, socket, "agent", "create", "intruder", "--", "true")
	if r.code == 0 {
		t.Errorf("agent create as nobody: exit 0: %s", r.stdout)
	}
	if out := ok(t, home, "agent", "ls"); strings.Contains(out, "intruder") {
		t.Errorf("nobody created an agent: %s", out)
	}
	logData, _ := os.ReadFile(filepath.Join(home, "daemon.log"))
	if !strings.Contains(string(logData), "admin connection refused") || !strings.Contains(string(logData), "uid=65534") || !strings.Contains(string(logData), "pid=") {
		t.Errorf("the daemon's log does not name the refused peer:\n%s", logData)
	}
	ok(t, home, "status")

	// socketGroup: members by a supplementary group only.
	group := newHome(t)
	if err := os.WriteFile(filepath.Join(group, "config.json"), []byte(`{"socketGroup": "users"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, group)
	socket = loosen(t, group)
	member := &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{100}}
	if r := cliAs(t, member, socket, "status"); r.code != 0 {
		t.Errorf("status as nobody in group users (supplementary): exit %d, stderr %q", r.code, r.stderr)
	}
	if r := cliAs(t, nobodyCred, socket, "status"); r.code == 0 || !strings.Contains(r.stderr, "members of group users only") {
		t.Errorf("status as nobody outside group users: exit %d, stderr %q; want it refused", r.code, r.stderr)
	}
}
