package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The bounds README.md documents for what a session can make the host
// store in its session directory.
const (
	boundViolationsFile = 512 << 10 // violations.json
	boundKinds          = 256       // kinds of refusal kept
	boundNotice         = 16 + 1024 // the one record past the output limit
	// shim.log: a few lines a run, one per kind of refusal (each under
	// 2 KiB), one when the kinds run out, and at most one summary a minute.
	shimLogBaseLines = 20
	shimLogLineBytes = 2 << 10
	// A microsandbox VM's console.log: 1 MiB and a notice.
	boundConsole = 1<<20 + 256
)

// shownViolations is the part of `session show --json` about refusals.
type shownViolations struct {
	ViolationCount    int64 `json:"violationCount"`
	ViolationsNotKept int64 `json:"violationsNotKept"`
	Violations        []struct {
		Protocol string `json:"protocol"`
		Host     string `json:"host"`
		Port     int    `json:"port"`
		Reason   string `json:"reason"`
		Count    int64  `json:"count"`
	} `json:"violations"`
}

// sessionFiles returns the size of each file in a session directory.
func sessionFiles(t *testing.T, home, id string) map[string]int64 {
	t.Helper()
	sizes := map[string]int64{}
	dir := filepath.Join(home, "sessions", id)
	filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			sizes[rel] = fi.Size()
		}
		return nil
	})
	return sizes
}

func total(sizes map[string]int64) (n int64) {
	for _, s := range sizes {
		n += s
	}
	return n
}

// violationEvents counts the session.violation events of a session.
func violationEvents(t *testing.T, home, id string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(ok(t, home, "events", "--json")), "\n") {
		var e struct{ Type, SessionID string }
		json.Unmarshal([]byte(line), &e)
		if e.Type == "session.violation" && e.SessionID == id {
			n++
		}
	}
	return n
}

// checkViolationBounds checks a session's directory after a flood of
// refusals: each file and the whole within the documented bounds, every
// refusal counted, the kinds listed, and no more events than kinds.
func checkViolationBounds(t *testing.T, home, id string, refusals int64, kinds int, outputLimit int64, took time.Duration) {
	t.Helper()
	sizes := sessionFiles(t, home, id)
	t.Logf("session files after %d refusals in %v: %v (%d bytes in all)", refusals, took.Round(time.Second), sizes, total(sizes))
	if _, ok := sizes["violations.jsonl"]; ok {
		t.Errorf("violations.jsonl is there: the unbounded log of refusals")
	}
	if sizes["violations.json"] > boundViolationsFile {
		t.Errorf("violations.json is %d bytes, over the documented %d", sizes["violations.json"], boundViolationsFile)
	}
	if sizes["output.log"] > outputLimit+boundNotice {
		t.Errorf("output.log is %d bytes, over the limit %d plus one notice", sizes["output.log"], outputLimit)
	}
	shimLog, _ := os.ReadFile(filepath.Join(home, "sessions", id, "shim.log"))
	maxLines := shimLogBaseLines + kinds + 1 + int(took/time.Minute) + 1
	if n := strings.Count(string(shimLog), "\n"); n > maxLines || len(shimLog) > maxLines*shimLogLineBytes {
		t.Errorf("shim.log has %d lines (%d bytes) after %d refusals of %d kinds, over the documented %d lines", n, len(shimLog), refusals, kinds, maxLines)
	}
	bound := outputLimit + boundNotice + boundViolationsFile + int64(maxLines*shimLogLineBytes) + 64<<10 // + the small JSON files
	if total(sizes) > bound {
		t.Errorf("the session directory holds %d bytes, over the documented %d", total(sizes), bound)
	}

	var shown shownViolations
	okJSON(t, home, &shown, "session", "show", id)
	var sum int64
	for _, v := range shown.Violations {
		sum += v.Count
	}
	if shown.ViolationCount != refusals || len(shown.Violations) != kinds || sum+shown.ViolationsNotKept != refusals {
		t.Errorf("session show: %d refused, %d kinds (counts add up to %d, %d not kept); want %d refused of %d kinds: %+v",
			shown.ViolationCount, len(shown.Violations), sum, shown.ViolationsNotKept, refusals, kinds, shown.Violations)
	}
	if n := violationEvents(t, home, id); n < 1 || n > len(shown.Violations) {
		t.Errorf("%d session.violation events for %d kinds, want one per kind", n, len(shown.Violations))
	}
}

// floodScript makes 100 000 connections to the srt proxy, each a CONNECT
// to a destination the policy refuses (a denied name, loopback, private,
// metadata and IPv6 loopback addresses), and counts the 403s.
const floodScript = `
import socket, struct, sys
targets = [("blocked.test", 443), ("127.0.0.1", 80), ("10.0.0.1", 80), ("169.254.169.254", 80), ("[::1]", 80)]
n = int(sys.argv[1])
refused = 0
for i in range(n):
    host, port = targets[i % len(targets)]
    s = socket.create_connection(("127.0.0.1", 3128))
    # Reset on close: no TIME_WAIT, so the loop never runs out of ports.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.sendall(("CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, port, host, port)).encode())
    if b" 403 " in s.recv(256):
        refused += 1
    s.close()
    if (i + 1) % 20000 == 0:
        print("connections", i + 1, flush=True)
print("refused", refused, flush=True)
`

// TestRefusedConnectionFloodIsBounded: a loop of 100 000 refused connections
// from inside an srt session leaves the session's files on the host within
// the documented bounds, every refusal counted, one event per kind, and the
// daemon answers status throughout.
func TestRefusedConnectionFloodIsBounded(t *testing.T) {
	requireBwrap(t)
	const connections = 100000
	const outputLimit = 1 << 20
	home := newHome(t)
	writeConfig(t, home, `{"outputLimitMiB": 1}`)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "flood", "--strategy", "srt", "--deny-domain", "blocked.test", "--",
		"python3", "-c", floodScript, fmt.Sprint(connections))
	start := time.Now()
	id := strings.TrimSpace(ok(t, home, "session", "start", "flood"))

	// Poll status while the loop runs: each must answer (run's timeout is
	// generous; no latency is asserted). The session directory is checked
	// on the way too, not only at the end.
	polls, largest := 0, int64(0)
	deadline := time.Now().Add(20 * time.Minute) // only stops a hung test
	for {
		if r := run(t, home, "", "status"); r.code != 0 {
			t.Fatalf("status during the flood (poll %d): exit %d: %s%s", polls, r.code, r.stdout, r.stderr)
		}
		polls++
		largest = max(largest, total(sessionFiles(t, home, id)))
		if show(t, home, id).State != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood still runs after 20 minutes: %s", ok(t, home, "session", "logs", id))
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	s := show(t, home, id)
	out := ok(t, home, "session", "logs", id)
	t.Logf("%d status polls answered during %v; the session directory peaked at %d bytes", polls, took.Round(time.Second), largest)
	if s.State != "exited" || s.ExitCode != 0 || !strings.Contains(out, fmt.Sprintf("refused %d", connections)) {
		t.Fatalf("flood session: %s exit %d (%s); output:\n%s", s.State, s.ExitCode, s.Reason, out)
	}
	checkViolationBounds(t, home, id, connections, 5, outputLimit, took)
	if largest > outputLimit+boundNotice+boundViolationsFile+1<<20 {
		t.Errorf("the session directory reached %d bytes during the flood", largest)
	}
}

// TestOutputLimitEndsTheSession: a session that prints past the daemon's
// output limit is stopped with the documented reason, its output.log stays
// within the limit plus one notice, and a resume of it does not start.
func TestOutputLimitEndsTheSession(t *testing.T) {
	const limit = 1 << 20
	home := newHome(t)
	writeConfig(t, home, `{"outputLimitMiB": 1}`)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "loud", "--", "sh", "-c", "exec yes 0123456789abcdef")
	id := strings.TrimSpace(ok(t, home, "session", "start", "loud"))
	ok(t, home, "session", "wait", id)
	s := show(t, home, id)
	if s.State != "exited" || s.ExitCode != 143 || s.Reason != "output limit of 1 MiB reached; killed by signal 15 (SIGTERM)" {
		t.Errorf("session: %s exit %d, reason %q; want exited 143 with the output limit", s.State, s.ExitCode, s.Reason)
	}
	size := sessionFiles(t, home, id)["output.log"]
	if size > limit+boundNotice || size < limit {
		t.Errorf("output.log is %d bytes, want the limit %d plus at most one notice", size, limit)
	}
	r := run(t, home, "", "session", "logs", id)
	if !strings.Contains(r.stderr, "output limit of 1 MiB reached") {
		t.Errorf("the log does not end with the notice; stderr: %q", r.stderr[max(0, len(r.stderr)-300):])
	}

	ok(t, home, "session", "resume", id)
	ok(t, home, "session", "wait", id)
	if s := show(t, home, id); s.State != "exited" || !strings.Contains(s.Reason, "output.log is full") {
		t.Errorf("resume of a full session: %s exit %d, reason %q", s.State, s.ExitCode, s.Reason)
	}
	if after := sessionFiles(t, home, id)["output.log"]; after != size {
		t.Errorf("output.log grew from %d to %d bytes on a resume", size, after)
	}
}

// vmFloodScript makes connections from the VM to destinations the policy
// refuses (private addresses, the metadata address, a denied name), which
// the shim's VM network refuses, and counts the refusals. (A flood of the
// VM's console needs root in the guest: TestMicrosandboxImageDockerAndRuntimes
// gets it through Docker.)
const vmFloodScript = `
const net = require("net");
const dns = require("dns");
const n = Number(process.argv[1]);
const targets = [["10.0.0.1", 80], ["192.168.1.1", 22], ["169.254.169.254", 80]];
let i = 0, refused = 0;
function next() {
	if (i >= n) {
		// And a denied name: NXDOMAIN, one violation however often asked.
		dns.lookup("blocked.test", () => dns.lookup("blocked.test", () => console.log("refused " + refused)));
		return;
	}
	const [host, port] = targets[i++ % targets.length];
	const s = net.connect({host, port});
	s.on("error", () => { refused++; next(); });
	s.on("connect", () => { s.destroy(); next(); });
}
next();
`

// TestMicrosandboxRefusalsAreBounded: the refusals of a microsandbox
// session (its VM network, not the srt proxy) go through the same bounded
// path: counted, one entry and one event per kind, bounded files.
func TestMicrosandboxRefusalsAreBounded(t *testing.T) {
	requireMicrosandbox(t)
	const connections = 3000
	h, _ := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "vmflood", "--strategy", "microsandbox", "--deny-domain", "blocked.test", "--",
		"node", "-e", vmFloodScript, fmt.Sprint(connections))
	start := time.Now()
	id := strings.TrimSpace(ok(t, h, "session", "start", "vmflood"))
	eventually(t, 10*time.Minute, "the VM flood ends", func() bool { return show(t, h, id).State != "running" })
	took := time.Since(start)
	s := show(t, h, id)
	out := ok(t, h, "session", "logs", id)
	if s.State != "exited" || s.ExitCode != 0 || !strings.Contains(out, fmt.Sprintf("refused %d", connections)) {
		t.Fatalf("VM flood session: %s exit %d (%s); output:\n%s\nshim log:\n%s", s.State, s.ExitCode, s.Reason, out, shimLog(h, id))
	}
	// The connections, and the one refused name.
	checkViolationBounds(t, h, id, connections+1, 4, 1024<<20, took)
}

// checkConsoleBounded: the console.log of session id's VM holds the first
// MiB of what the guest wrote to its console and the notice, no more.
func checkConsoleBounded(t *testing.T, h, id string) {
	t.Helper()
	consoles, _ := filepath.Glob(filepath.Join(h, "vms", id, "*", "console.log"))
	if len(consoles) != 1 {
		t.Fatalf("console.log of the VM: %v", consoles)
	}
	if fi, err := os.Stat(consoles[0]); err != nil || fi.Size() > boundConsole || fi.Size() < 1<<20 {
		t.Errorf("console.log after 3 MiB written to the console: %v bytes (%v), want 1 MiB and a notice", fi.Size(), err)
	}
}
