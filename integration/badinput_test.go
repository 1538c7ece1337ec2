package integration

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

// TestBadInput feeds the daemon bad requests: each gets a clear error,
// changes nothing, and the daemon keeps serving.
func TestBadInput(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "good", "--", "sh", "-c", "echo ok")
	outside := t.TempDir()
	agentDir := func() string {
		var a struct{ Dir string }
		okJSON(t, home, &a, "agent", "show", "good")
		return a.Dir
	}()
	os.Symlink(outside, filepath.Join(agentDir, "escape"))

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown agent", []string{"session", "start", "nosuch"}, `no agent named "nosuch"`},
		{"unknown session", []string{"session", "show", "ffffffffffffffff"}, "no session"},
		{"duplicate name", []string{"agent", "create", "good", "--", "true"}, "already exists"},
		{"name with slash", []string{"agent", "create", "a/b", "--", "true"}, `agent name "a/b"`},
		{"empty command", []string{"agent", "create", "nocmd"}, "empty command"},
		{"workspace dotdot", []string{"agent", "create", "w1", "--workspace", "../../x", "--", "true"}, "inside the agent directory"},
		{"workspace symlink", []string{"agent", "edit", "good", "--workspace", "escape/sub"}, "outside"},
		{"mount in daemon home", []string{"agent", "create", "m1", "--mount", filepath.Join(home, "sessions") + ":/data", "--", "true"}, "inside the daemon home"},
		{"mount over proc", []string{"agent", "create", "m2", "--mount", outside + ":/proc", "--", "true"}, "may not cover /proc"},
		{"bad mount syntax", []string{"agent", "create", "m3", "--mount", "nocolon", "--", "true"}, "want SRC:DST"},
		{"unknown strategy", []string{"agent", "create", "s1", "--strategy", "docker", "--", "true"}, "unknown execution strategy"},
		{"unavailable strategy", []string{"agent", "create", "s2", "--strategy", "microsandbox", "--", "true"}, "not available on this daemon"},
		{"bad offset", []string{"session", "attach", "nosuch", "--from", "3"}, "no session"},
		{"bad signal", []string{"session", "kill", "x", "--signal", "NOPE"}, "unknown signal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, home, "", tc.args...)
			if r.code == 0 {
				t.Fatalf("exit 0, want an error; stdout %q", r.stdout)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q lacks %q", r.stderr, tc.want)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n > 0 {
				t.Errorf("the error is %d lines, want one: %q", n+1, r.stderr)
			}
		})
	}
	// Nothing changed: one agent, one directory, no session.
	var agents []struct{ Name string }
	okJSON(t, home, &agents, "agent", "ls")
	if len(agents) != 1 {
		t.Errorf("after the bad requests there are %d agents, want 1", len(agents))
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "agents")); len(entries) != 1 {
		t.Errorf("agents/ holds %d entries, want 1", len(entries))
	}
	if entries, _ := os.ReadDir(filepath.Join(home, "sessions")); len(entries) != 0 {
		t.Errorf("sessions/ holds %d entries, want 0", len(entries))
	}

	// An exec of an unknown agent is an agentconnect error: 125.
	if r := run(t, home, "", "exec", "nosuch"); r.code != 125 {
		t.Errorf("exec of an unknown agent: exit %d, want 125", r.code)
	}
	// A session's output offset that is not a record boundary.
	id := strings.TrimSpace(ok(t, home, "session", "start", "good"))
	ok(t, home, "session", "wait", id)
	if r := run(t, home, "", "session", "attach", id, "--from", "3"); r.code == 0 || !strings.Contains(r.stderr, "not a record boundary") {
		t.Errorf("attach from 3: exit %d, %q", r.code, r.stderr)
	}
	if r := run(t, home, "", "status"); r.code != 0 {
		t.Fatalf("the daemon stopped serving: %+v", r)
	}
}

func TestMalformedAdminRequests(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	sock := filepath.Join(home, "run", "agentconnect.sock")

	// Garbage, a frame that claims 1 GiB, and a frame whose payload is not
	// a request: each on its own connection.
	huge := make([]byte, 10)
	binary.BigEndian.PutUint32(huge[0:4], 1<<30)
	binary.BigEndian.PutUint32(huge[4:8], 1)
	huge[8] = 1
	bad := make([]byte, 10)
	binary.BigEndian.PutUint32(bad[0:4], 5)
	binary.BigEndian.PutUint32(bad[4:8], 1)
	bad[8] = 1
	bad = append(bad, 0xff, 0xff, 0xff, 0xff, 0xff)
	for _, payload := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), huge, bad, {0, 0}} {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(payload)
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		buf := make([]byte, 256)
		conn.Read(buf)
		conn.Close()
	}

	// An oversized message through a real client: refused, nothing else.
	admin := adminClient(t, home)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := admin.WriteStdin(ctx, &adminv1.WriteStdinRequest{Id: "x", Data: make([]byte, 5<<20)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a 5 MiB request: %v, want ResourceExhausted", err)
	}
	_, err = admin.CreateAgent(ctx, &adminv1.CreateAgentRequest{})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("an empty CreateAgent: %v, want InvalidArgument", err)
	}
	if r := run(t, home, "", "status"); r.code != 0 {
		t.Fatalf("the daemon stopped serving after malformed requests: %+v", r)
	}
}

func TestTenMegabyteLineOnStdin(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)
	ok(t, home, "agent", "create", "counter", "--", "wc", "-c")
	line := strings.Repeat("a", 10<<20) + "\n"
	r := run(t, home, line, "exec", "counter")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "10485761" {
		t.Errorf("wc -c of a 10 MB line: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := run(t, home, "", "status"); r.code != 0 {
		t.Fatalf("the daemon stopped serving: %+v", r)
	}
}

func TestLongHome(t *testing.T) {
	home := filepath.Join(t.TempDir(), strings.Repeat("long-directory-name-", 6))
	if len(home)+len("/run/agentconnect.sock") <= 107 {
		t.Fatalf("home %s is not too long for a socket", home)
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, home)
	ok(t, home, "agent", "create", "hi", "--", "sh", "-c", "echo hi")
	if r := run(t, home, "", "exec", "hi"); r.code != 0 || r.stdout != "hi\n" {
		t.Errorf("exec in a long home: %+v", r)
	}
}
