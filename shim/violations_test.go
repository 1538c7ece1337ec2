package shim

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// maxViolationsFile is the bound README.md and design-notes.md give for
// violations.json.
const maxViolationsFile = 512 << 10

func testViolationLog(t *testing.T, dir session.Dir) (*Violations, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	log := logrus.New()
	log.SetOutput(&buf)
	log.SetFormatter(&logrus.JSONFormatter{})
	return openViolations(dir, log.WithField("session", "s1")), &buf
}

func lines(s string) int { return strings.Count(s, "\n") }

// TestViolationLogIsBounded: a flood of refusals, of a few kinds and of
// more kinds than are kept, with fields of any size, leaves a bounded file
// that counts all of them, and a bounded shim log.
func TestViolationLogIsBounded(t *testing.T) {
	dir := session.Dir(t.TempDir())
	l, logged := testViolationLog(t, dir)
	huge := strings.Repeat("\x00<\"é\u2028", 10000) // the proxy reads headers of up to 64 KiB
	kinds := []netpolicy.Violation{
		{Protocol: "connect", Host: "blocked.test", Port: 443, Reason: "blocked.test is in deniedDomains"},
		{Protocol: "connect", Host: "127.0.0.1", Port: 80, Addr: "127.0.0.1", Reason: "127.0.0.1 is a loopback address"},
		{Protocol: "tcp", Host: "10.0.0.1", Port: 22, Addr: "10.0.0.1", Reason: "10.0.0.1 is a private address"},
		{Protocol: huge, Host: huge, Port: 1, Addr: huge, Reason: huge},
	}
	const repeats = 5000
	for i := range repeats {
		for _, v := range kinds {
			l.Add(v)
		}
		if i%10 == 0 {
			// A new port each time: more kinds than are kept.
			l.Add(netpolicy.Violation{Protocol: "connect", Host: "blocked.test", Port: 1000 + i, Reason: "blocked.test is in deniedDomains"})
		}
	}
	l.Close()

	total := uint64(repeats*len(kinds) + repeats/10)
	v, err := dir.ReadViolations()
	if err != nil {
		t.Fatal(err)
	}
	if v.Total != total {
		t.Errorf("total = %d, want %d", v.Total, total)
	}
	if len(v.Entries) != session.MaxViolationKinds {
		t.Errorf("%d kinds kept, want %d", len(v.Entries), session.MaxViolationKinds)
	}
	if want := uint64(repeats/10 - (session.MaxViolationKinds - len(kinds))); v.Dropped != want {
		t.Errorf("dropped = %d, want %d", v.Dropped, want)
	}
	var sum uint64
	for i, e := range v.Entries {
		sum += e.Count
		if i < len(kinds) && e.Count != repeats {
			t.Errorf("kind %d counted %d times, want %d", i, e.Count, repeats)
		}
		if e.First.IsZero() || e.Time.Before(e.First) {
			t.Errorf("kind %d: first %v, last %v", i, e.First, e.Time)
		}
	}
	if sum+v.Dropped != total {
		t.Errorf("counts add up to %d + %d dropped, want %d", sum, v.Dropped, total)
	}
	if e := v.Entries[3]; len(e.Host) > maxViolationHost || len(e.Reason) > maxViolationReason || strings.ContainsAny(e.Host, "\x00\u2028") {
		t.Errorf("a huge host is kept as %d bytes (%q...)", len(e.Host), e.Host[:20])
	}
	fi, err := os.Stat(dir.ViolationsPath())
	if err != nil {
		t.Fatal(err)
	}
	size := fi.Size()
	if size > maxViolationsFile {
		t.Errorf("violations.json is %d bytes, over the documented %d", size, maxViolationsFile)
	}
	// With every kind at its largest the file stays within the bound too.
	full := *v
	for i := range full.Entries {
		quotes := strings.Repeat(`"`, 1000) // two bytes each in JSON: the worst
		full.Entries[i].Violation = bound(netpolicy.Violation{Time: time.Now(), Protocol: quotes, Host: quotes, Port: 65535, Addr: quotes, Reason: quotes})
		full.Entries[i].Count = 1 << 62
	}
	worst := session.Dir(t.TempDir())
	if err := worst.WriteViolations(&full, false); err != nil {
		t.Fatal(err)
	}
	fi, _ = os.Stat(worst.ViolationsPath())
	t.Logf("violations.json: %d bytes for this flood, %d with every kind at its largest", size, fi.Size())
	if fi.Size() > maxViolationsFile {
		t.Errorf("violations.json of %d kinds at their largest is %d bytes, over the documented %d", len(full.Entries), fi.Size(), maxViolationsFile)
	}
	// One line per kind kept, one when the kinds ran out, and a summary at
	// the end (the test runs in well under violationsSummaryInterval).
	if n := lines(logged.String()); n > session.MaxViolationKinds+3 {
		t.Errorf("the shim logged %d lines for %d refusals, want at most %d", n, total, session.MaxViolationKinds+3)
	}
	if !strings.Contains(logged.String(), "more connections") {
		t.Errorf("no summary line at the end:\n%s", logged.String()[max(0, logged.Len()-2000):])
	}
}

// TestViolationLogContinues: a resumed session's shim carries on with the
// earlier refusals, appending new kinds after them.
func TestViolationLogContinues(t *testing.T) {
	dir := session.Dir(t.TempDir())
	a := netpolicy.Violation{Protocol: "connect", Host: "a.test", Port: 443, Reason: "denied"}
	b := netpolicy.Violation{Protocol: "tcp", Host: "10.0.0.1", Port: 80, Reason: "private"}
	l, _ := testViolationLog(t, dir)
	l.Add(a)
	l.Add(a)
	l.Close()
	l, _ = testViolationLog(t, dir)
	l.Add(b)
	l.Add(a)
	l.Close()
	v, err := dir.ReadViolations()
	if err != nil {
		t.Fatal(err)
	}
	if v.Total != 4 || len(v.Entries) != 2 || v.Entries[0].Host != "a.test" || v.Entries[0].Count != 3 || v.Entries[1].Host != "10.0.0.1" {
		t.Errorf("after a resume: %+v", v)
	}
}

// TestViolationLogWritesWhileRunning: the supervisor sees refusals during
// the run, not only at its end.
func TestViolationLogWritesWhileRunning(t *testing.T) {
	dir := session.Dir(t.TempDir())
	l, _ := testViolationLog(t, dir)
	defer l.Close()
	l.Add(netpolicy.Violation{Protocol: "connect", Host: "a.test", Port: 443, Reason: "denied"})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if v, _ := dir.ReadViolations(); v.Total == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("violations.json not written within 10 s of a refusal")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestViolationLogFoldsLegacyLog: the unbounded violations.jsonl of an
// earlier version becomes entries of violations.json (marked as reported)
// and goes.
func TestViolationLogFoldsLegacyLog(t *testing.T) {
	dir := session.Dir(t.TempDir())
	var legacy strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&legacy, `{"time":"2024-01-01T00:00:00Z","protocol":"connect","host":"h%d.test","port":443,"addr":"","reason":"denied"}`+"\n", i%3)
	}
	legacy.WriteString("not json\n")
	if err := os.WriteFile(dir.LegacyViolationsPath(), []byte(legacy.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	l, _ := testViolationLog(t, dir)
	l.Close()
	v, err := dir.ReadViolations()
	if err != nil {
		t.Fatal(err)
	}
	if v.Total != 1000 || len(v.Entries) != 3 || v.Imported != 3 {
		t.Errorf("folded: total %d, %d kinds, %d imported; want 1000, 3, 3", v.Total, len(v.Entries), v.Imported)
	}
	if _, err := os.Stat(dir.LegacyViolationsPath()); !os.IsNotExist(err) {
		t.Errorf("violations.jsonl is still there: %v", err)
	}
	if names, _ := filepath.Glob(filepath.Join(string(dir), ".*tmp*")); len(names) > 0 {
		t.Errorf("temporary files left: %v", names)
	}
}
