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

	"github.com/agentconnect-md/agentconnect/procstat"
	sessionfiles "github.com/agentconnect-md/agentconnect/session"
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
