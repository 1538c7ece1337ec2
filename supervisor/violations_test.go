package supervisor

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

func violationSupervisor(t *testing.T) (*Supervisor, *sessionState) {
	t.Helper()
	s := &Supervisor{events: newEventLog(), log: logrus.New(), ctx: context.Background()}
	dir := session.Dir(t.TempDir())
	return s, newSessionState(dir, &session.Record{ID: "s1", Agent: "a"})
}

func writeKinds(t *testing.T, dir session.Dir, imported int, hosts ...string) {
	t.Helper()
	v := &session.Violations{Imported: imported}
	for _, h := range hosts {
		v.Total += 10
		v.Entries = append(v.Entries, session.ViolationEntry{
			Violation: netpolicy.Violation{Time: time.Now(), Protocol: "connect", Host: h, Port: 443, Reason: "denied"}, Count: 10,
		})
	}
	if err := dir.WriteViolations(v, false); err != nil {
		t.Fatal(err)
	}
}

func violationEvents(s *Supervisor) []string {
	var hosts []string
	for _, e := range s.events.snapshot() {
		if e.Type == "session.violation" {
			hosts = append(hosts, strings.Fields(e.Message)[1])
		}
	}
	return hosts
}

// TestViolationEventsOncePerKind: an event per new kind, none for repeats,
// none again from a restarted supervisor, none for kinds an earlier version
// reported.
func TestViolationEventsOncePerKind(t *testing.T) {
	s, ss := violationSupervisor(t)
	var reported session.ViolationsReported
	writeKinds(t, ss.dir, 1, "old.test", "a.test", "b.test")
	s.reportViolations(ss, &reported)
	writeKinds(t, ss.dir, 1, "old.test", "a.test", "b.test") // counts went up
	s.reportViolations(ss, &reported)
	writeKinds(t, ss.dir, 1, "old.test", "a.test", "b.test", "c.test")
	s.reportViolations(ss, &reported)
	if got, want := fmt.Sprint(violationEvents(s)), "[a.test:443 b.test:443 c.test:443]"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}

	// A restarted supervisor starts from what the last one recorded.
	s2, ss2 := violationSupervisor(t)
	ss2.dir = ss.dir
	f := s2.followViolations(ss2)
	writeKinds(t, ss.dir, 1, "old.test", "a.test", "b.test", "c.test", "d.test")
	f.finish()
	if got, want := fmt.Sprint(violationEvents(s2)), "[d.test:443]"; got != want {
		t.Errorf("after a restart: events %s, want %s", got, want)
	}
}

// TestViolationFollowerSeesRewrites: the follower wakes on each atomic
// rewrite while the run lasts, and finish reports the last one at once.
func TestViolationFollowerSeesRewrites(t *testing.T) {
	s, ss := violationSupervisor(t)
	f := s.followViolations(ss)
	writeKinds(t, ss.dir, 0, "a.test")
	deadline := time.Now().Add(10 * time.Second)
	for len(violationEvents(s)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no event within 10 s of a rewrite")
		}
		time.Sleep(10 * time.Millisecond)
	}
	writeKinds(t, ss.dir, 0, "a.test", "b.test")
	f.finish()
	if got, want := fmt.Sprint(violationEvents(s)), "[a.test:443 b.test:443]"; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
}
