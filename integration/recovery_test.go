package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/leftovers"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// counter prints 1, 2, 3, ... one line every 50 ms.
const counter = `i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done`

// checkCounter fails unless out is the lines 1..n in order, none missing or
// repeated, and returns n.
func checkCounter(t *testing.T, what, out string) int {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		v, err := strconv.Atoi(sc.Text())
		if err != nil || v != n+1 {
			t.Fatalf("%s: line %d is %q, want %d (gap, duplicate or garbage)", what, n+1, sc.Text(), n+1)
		}
		n = v
	}
	if !strings.HasSuffix(out, "\n") && out != "" {
		t.Fatalf("%s: ends in a partial line", what)
	}
	return n
}

func TestSupervisorSIGKILLKeepsSessions(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "counter", "--", "sh", "-c", counter)

	const n = 20
	ids := make([]string, n)
	pids := map[string]int{}
	for i := range ids {
		ids[i] = strings.TrimSpace(ok(t, home, "session", "start", "counter"))
	}
	for _, id := range ids {
		s := show(t, home, id)
		if s.State != "running" || s.PID == 0 {
			t.Fatalf("session %s: %+v, want running", id, s)
		}
		pids[id] = s.PID
	}

	// An attach left running across the SIGKILLs.
	var attachOut bytes.Buffer
	attach := exec.Command(agentconnect(), "--home", home, "session", "attach", ids[0])
	attach.Stdout = &attachOut
	attach.Stderr = os.Stderr
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	attachDone := make(chan error, 1)
	go func() { attachDone <- attach.Wait() }()

	for round := 1; round <= 3; round++ {
		time.Sleep(300 * time.Millisecond)
		d.kill9()
		time.Sleep(300 * time.Millisecond) // the sessions go on alone
		d.restart()
		for _, id := range ids {
			s := show(t, home, id)
			if s.State != "running" || s.PID != pids[id] {
				t.Fatalf("round %d: session %s is %s with pid %d, want running with pid %d (%s)", round, id, s.State, s.PID, pids[id], s.Reason)
			}
			checkCounter(t, fmt.Sprintf("round %d: session %s log", round, id), ok(t, home, "session", "logs", id))
		}
	}
	select {
	case err := <-attachDone:
		t.Fatalf("attach ended across the restarts: %v", err)
	default:
	}
	ok(t, home, "session", "stop", ids[0])
	select {
	case err := <-attachDone:
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
	case <-time.After(20 * time.Second):
		attach.Process.Kill()
		t.Fatal("attach did not end when the session stopped")
	}
	log := ok(t, home, "session", "logs", ids[0])
	if attachOut.String() != log {
		t.Errorf("attach printed %d bytes, the log has %d: they differ", attachOut.Len(), len(log))
	}
	if lines := checkCounter(t, "attach output", attachOut.String()); lines < 20 {
		t.Errorf("attach printed only %d lines", lines)
	}
}

func TestStopResumeRemove(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "counter", "--", "sh", "-c", counter)
	id := strings.TrimSpace(ok(t, home, "session", "start", "counter"))
	time.Sleep(300 * time.Millisecond)
	stopped := show(t, home, strings.TrimSpace(ok(t, home, "session", "stop", id)))
	if stopped.State != "exited" || stopped.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("after stop: %+v, want exited with %d", stopped, 128+int(syscall.SIGTERM))
	}
	before := ok(t, home, "session", "logs", id)
	checkCounter(t, "first run", before)

	if got := strings.TrimSpace(ok(t, home, "session", "resume", id)); got != id {
		t.Fatalf("resume printed %q, want the same id %q", got, id)
	}
	s := show(t, home, id)
	if s.State != "running" || s.Run != 2 {
		t.Fatalf("after resume: %+v, want running, run 2", s)
	}
	eventually(t, 10*time.Second, "the resumed run prints", func() bool {
		return len(ok(t, home, "session", "logs", id)) > len(before)
	})
	after := ok(t, home, "session", "logs", id)
	if !strings.HasPrefix(after, before) {
		t.Fatal("the resumed log does not continue after the old output")
	}
	checkCounter(t, "second run", after[len(before):])

	// rm refuses a running session, then removes it and all it owns.
	if r := run(t, home, "", "session", "rm", id); r.code == 0 || !strings.Contains(r.stderr, "running") {
		t.Fatalf("rm of a running session: exit %d, %q", r.code, r.stderr)
	}
	ok(t, home, "session", "rm", "--force", id)
	if _, err := os.Stat(home + "/sessions/" + id); !os.IsNotExist(err) {
		t.Errorf("session directory still there: %v", err)
	}
	entries, _ := os.ReadDir(home + "/sessions")
	if len(entries) != 0 {
		t.Errorf("sessions/ still holds %d entries", len(entries))
	}
	if r := run(t, home, "", "session", "show", id); r.code == 0 {
		t.Error("a removed session still shows")
	}
	if cg := s.Cgroup; cg != "" {
		if _, err := os.Stat(cg); !os.IsNotExist(err) {
			t.Errorf("cgroup %s still there", cg)
		}
	}
	if socks, _ := os.ReadDir(home + "/run"); len(socks) > 0 {
		for _, e := range socks {
			if strings.HasSuffix(e.Name(), ".sock") && e.Name() != "agentconnect.sock" {
				t.Errorf("shim socket %s left behind", e.Name())
			}
		}
	}
}

func TestExitWhileSupervisorDown(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "seven", "--", "sh", "-c", "sleep 1; exit 7")
	id := strings.TrimSpace(ok(t, home, "session", "start", "seven"))
	d.kill9()
	time.Sleep(1500 * time.Millisecond)
	d.restart()
	s := show(t, home, id)
	if s.State != "exited" || s.ExitCode != 7 {
		t.Fatalf("after restart: %+v, want exited with exitCode 7", s)
	}
}

func TestShimSIGKILLLosesSession(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--", "sh", "-c", "sleep 600 & sleep 600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	s := show(t, home, id)
	eventually(t, 5*time.Second, "the background sleep starts", func() bool { return len(processesInGroup(s.PID)) >= 2 })
	shimStart, _ := procstat.StartTime(s.ShimPID)
	if err := syscall.Kill(s.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	eventually(t, 2*time.Second, "the session becomes lost", func() bool { return show(t, home, id).State == "lost" })
	t.Logf("lost %v after the shim was killed", time.Since(killed).Round(time.Millisecond))
	lost := show(t, home, id)
	if lost.Reason == "" {
		t.Error("lost without a reason")
	}
	if procstat.Alive(s.ShimPID, shimStart) {
		t.Error("the shim is alive")
	}
	if left := processesInGroup(s.PID); len(left) > 0 {
		t.Errorf("runtime processes left: %v", left)
	}
}

// TestManySessionsAtOnce starts sessions concurrently: ids, sockets and
// cgroups never collide.
func TestManySessionsAtOnce(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "hi", "--", "sh", "-c", "echo hi")
	var wg sync.WaitGroup
	errs := make(chan string, 10)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := run(t, home, "", "exec", "hi")
			if r.code != 0 || r.stdout != "hi\n" {
				errs <- fmt.Sprintf("exec: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestRecoveryRemovesStrayCgroups: a supervisor killed between making a
// session's cgroup and writing its record leaves a cgroup no session names
// (make chaos found one); the next supervisor removes it, and leaves the
// cgroups of the sessions it adopts alone.
func TestRecoveryRemovesStrayCgroups(t *testing.T) {
	requireRoot(t)
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "sleeper"))
	live := show(t, home, id)
	if live.Cgroup == "" {
		t.Skip("sessions run without cgroups here")
	}
	roots := leftovers.CgroupRoots(live.Cgroup)
	d.kill9()
	const stray = "0123456789abcdef"
	for _, r := range roots {
		if err := os.Mkdir(filepath.Join(r, stray), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d.restart()
	if left := leftovers.SessionCgroups(roots, map[string]bool{stray: true}); len(left) > 0 {
		t.Errorf("the stray cgroup is still there after recovery: %v", left)
	}
	if kept := leftovers.SessionCgroups(roots, map[string]bool{id: true}); len(kept) != len(roots) {
		t.Errorf("the adopted session's cgroup: %v in %d hierarchies, want all %d", kept, len(kept), len(roots))
	}
	if s := show(t, home, id); s.State != "running" || s.PID != live.PID {
		t.Errorf("the adopted session: %+v, want running with pid %d", s, live.PID)
	}
}
