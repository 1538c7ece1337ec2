package shim

import (
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// warmService is a warm shim's service whose record is in a directory of
// the test's: what it was prepared from.
func warmService(t *testing.T) (*service, session.Dir) {
	t.Helper()
	dir := session.Dir(t.TempDir())
	rec := &session.Record{ID: "0123456789abcdef", Run: 1, Warm: true, Spec: session.Spec{Command: []string{"/bin/prepared"}, Env: []string{"PREPARED=1"}}}
	if err := dir.WriteRecord(rec); err != nil {
		t.Fatal(err)
	}
	return newService(rec, dir, nil, logrus.NewEntry(logrus.New()), nil, newReaper()), dir
}

func TestClaimWithStart(t *testing.T) {
	s, _ := warmService(t)
	at := time.Date(2026, 12, 5, 15, 0, 0, 0, time.UTC)
	// session.json still says warm: the claim that came with Start binds.
	if err := s.claimLocked(&shimv1.Claim{Command: []string{"/bin/echo", "x"}, CommandOverride: true, Env: []string{"A=1"}, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	got := s.rec
	if got.Warm || !got.CreatedAt.Equal(at) || len(got.Spec.Command) != 2 || got.Spec.Command[0] != "/bin/echo" || !got.Spec.CommandOverride || len(got.Spec.Env) != 1 || got.Spec.Env[0] != "A=1" {
		t.Fatalf("claimed record = %+v, want the claim's command, env and time", got)
	}
}

func TestClaimFromRecord(t *testing.T) {
	s, dir := warmService(t)
	// A supervisor of API version 5 writes the claim in session.json and
	// sends none: the shim reads it there, and refuses a record still warm.
	if err := s.claimLocked(nil); err == nil {
		t.Fatal("a claim from a record that is still warm was taken")
	}
	at := time.Date(2026, 12, 5, 15, 0, 0, 0, time.UTC)
	rec := *s.rec
	rec.Warm, rec.CreatedAt = false, at
	rec.Spec.Command, rec.Spec.Env = []string{"/bin/true"}, []string{"B=2"}
	if err := dir.WriteRecord(&rec); err != nil {
		t.Fatal(err)
	}
	if err := s.claimLocked(nil); err != nil {
		t.Fatal(err)
	}
	if s.rec.Warm || !s.rec.CreatedAt.Equal(at) || s.rec.Spec.Command[0] != "/bin/true" || s.rec.Spec.Env[0] != "B=2" {
		t.Fatalf("claimed record = %+v, want session.json's command, env and time", s.rec)
	}
}

func TestClaimWithoutCommandRefused(t *testing.T) {
	s, _ := warmService(t)
	if err := s.claimLocked(&shimv1.Claim{Env: []string{"A=1"}}); err == nil {
		t.Fatal("a claim without a command was taken")
	}
	if !s.rec.Warm || s.rec.Spec.Command[0] != "/bin/prepared" {
		t.Fatalf("a refused claim changed the record: %+v", s.rec)
	}
}
