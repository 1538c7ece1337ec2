package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// A shim that did not answer during recovery is tried again from before
// recovery has put its session in the supervisor's map; its end is taken
// all the same. (make chaos SEED=248148816: a recovery that took 1.6 s left
// two sessions running for good after their shims had exited.)
func TestReadoptTakesTheEndOfASessionRecoveryHasNotRegistered(t *testing.T) {
	s := newTestSupervisor(t, "", nil)
	rec := &session.Record{ID: "0123456789abcdef", Run: 1, Agent: "a"}
	dir := session.Dir(s.layout.SessionDir(rec.ID))
	if err := os.MkdirAll(string(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := dir.WriteRecord(rec); err != nil {
		t.Fatal(err)
	}
	// A process stands in for the unanswering shim: readopt goes by its
	// pid and start time, and it ends without recording an exit.
	shim := exec.Command("sleep", "600")
	if err := shim.Start(); err != nil {
		t.Fatal(err)
	}
	defer shim.Process.Kill()
	startTime, err := procstat.StartTime(shim.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	boot := &session.Bootstrap{Address: "/nonexistent.sock", PID: shim.Process.Pid, StartTime: startTime, Run: rec.Run}
	if err := dir.WriteBootstrap(boot); err != nil {
		t.Fatal(err)
	}
	ss := newSessionState(dir, rec)
	ss.setUnanswered(0, boot.PID, "not answering")

	done := make(chan struct{})
	go func() { s.readopt(ss, boot); close(done) }()
	shim.Process.Kill()
	shim.Wait()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("readopt still runs a minute after the shim died")
	}
	if v := ss.view(); v.State != session.Lost {
		t.Errorf("after its shim died: %s (%s), want lost", v.State, v.Reason)
	}
}

// A start the supervisor was killed in may not have made its cgroup: the
// next supervisor makes it where the record says before it starts the run,
// and refuses a record that names cgroups it would not make.
func TestFinishCgroupMakesTheRecordsCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making cgroups needs root")
	}
	s := newTestSupervisor(t, "", nil)
	if s.cgroups == nil {
		t.Skipf("no cgroups here: %s", s.cgSupport.Reason)
	}
	rec := &session.Record{ID: "0123456789abcdef", Run: 1}
	rec.Spec.Cgroup = s.cgroups.Dirs(rec.ID)
	cg := cgroupfs.Cgroup{Dirs: rec.Spec.Cgroup}
	defer cg.Remove()
	for _, d := range rec.Spec.Cgroup {
		if _, err := os.Stat(d); err == nil {
			t.Fatalf("%s exists before the test", d)
		}
	}
	for range 2 { // the second time finds it made
		if err := s.finishCgroup(rec); err != nil {
			t.Fatal(err)
		}
		for _, d := range rec.Spec.Cgroup {
			if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err != nil {
				t.Errorf("after finishCgroup: %v", err)
			}
		}
	}

	moved := &session.Record{ID: "fedcba9876543210", Run: 1}
	moved.Spec.Cgroup = []string{filepath.Join(filepath.Dir(rec.Spec.Cgroup[0]), "elsewhere", moved.ID)}
	if err := s.finishCgroup(moved); err == nil || !strings.Contains(err.Error(), "start the session again") {
		t.Errorf("a record naming another parent: %v, want a refusal that says what to do", err)
	}
	if _, err := os.Stat(moved.Spec.Cgroup[0]); err == nil {
		os.Remove(moved.Spec.Cgroup[0])
		t.Errorf("a refused record's cgroup was made")
	}
}
