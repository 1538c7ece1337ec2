package integration

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// hostService is a service of the host on one of its own non-loopback
// addresses: publicHostIP, the host's end of the veth that startPublicNet
// makes. It listens on that address rather than 0.0.0.0 so that nothing
// listens on this machine's real interfaces during the test; a service bound
// to 0.0.0.0 is reached at the address the same way.
func hostService(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", publicHostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "host service") }))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().(*net.TCPAddr).Port
}

// violationReasons returns the reasons of a session's violations by host.
func violationReasons(t *testing.T, home, id string) map[string]string {
	t.Helper()
	var shown struct {
		Violations []struct {
			Host   string `json:"host"`
			Reason string `json:"reason"`
		} `json:"violations"`
	}
	okJSON(t, home, &shown, "session", "show", id)
	reasons := map[string]string{}
	for _, v := range shown.Violations {
		reasons[v.Host] += v.Reason + "; "
	}
	return reasons
}

// TestSRTHostAddressRefused: a session cannot reach a service of the host at
// the host's own (non-loopback) address through the srt proxy, while the
// public server behind that same interface stays reachable; an explicit
// entry opens exactly that address and port.
func TestSRTHostAddressRefused(t *testing.T) {
	requireBwrap(t)
	startPublicNet(t)
	port := hostService(t)
	home := newHome(t)
	startDaemon(t, home)

	ok(t, home, "agent", "create", "open", "--strategy", "srt", "--", "sh", "-c", netScript+fmt.Sprintf(`
get host-addr -x "$HTTP_PROXY" http://%[1]s:%[2]d/
get host-addr-socks --socks5 127.0.0.1:1080 http://%[1]s:%[2]d/
get host-addr-mapped -x "$HTTP_PROXY" http://[::ffff:%[1]s]:%[2]d/
get public -x "$HTTP_PROXY" http://%[3]s:%[4]d/
`, publicHostIP, port, publicServerIP, publicPort))
	r := run(t, home, "", "exec", "--keep", "open")
	codes := parseCodes(r.stdout)
	for name, want := range map[string]string{"host-addr": "403", "host-addr-mapped": "403", "public": "200"} {
		if codes[name] != want {
			t.Errorf("%s = %q, want %s\n%s%s", name, codes[name], want, r.stdout, r.stderr)
		}
	}
	if c := codes["host-addr-socks"]; c == "200" {
		t.Errorf("SOCKS5 to the host's own address = %s, want a failure", c)
	}
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls", "--agent", "open")
	if len(sessions) != 1 {
		t.Fatalf("sessions of open: %+v", sessions)
	}
	if reason := violationReasons(t, home, sessions[0].ID)[publicHostIP]; !strings.Contains(reason, publicHostIP) || !strings.Contains(reason, "address of this host") {
		t.Errorf("violation for %s: %q, want it to name the host's own address", publicHostIP, reason)
	}

	entry := fmt.Sprintf("%s:%d", publicHostIP, port)
	ok(t, home, "agent", "create", "entry", "--strategy", "srt", "--allow-domain", entry, "--", "sh", "-c", netScript+fmt.Sprintf(`
get host-entry -x "$HTTP_PROXY" http://%[1]s/
`, entry))
	r = run(t, home, "", "exec", "entry")
	if c := parseCodes(r.stdout)["host-entry"]; c != "200" {
		t.Errorf("with the entry %q: host-entry = %q, want 200\n%s%s", entry, c, r.stdout, r.stderr)
	}
}

// TestMicrosandboxHostAddressRefused: the VM network, which dials from the
// host's network namespace too, refuses the host's own address (one VM).
func TestMicrosandboxHostAddressRefused(t *testing.T) {
	requireMicrosandbox(t)
	startPublicNet(t)
	port := hostService(t)
	h, _ := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "open", "--strategy", "microsandbox", "--", "bash", "-c", fmt.Sprintf(`
conn() {
	if out=$(timeout 8 bash -c "exec 3<>/dev/tcp/$2/$3 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -c 64 <&3" 2>/dev/null) && [ -n "$out" ]; then
		echo "$1 connected"
	else
		echo "$1 refused"
	fi
}
conn host-addr %[1]s %[2]d
conn public %[3]s %[4]d
`, publicHostIP, port, publicServerIP, publicPort))
	id, out := startAndWait(t, h, "open", "")
	codes := parseCodes(out)
	for name, want := range map[string]string{"host-addr": "refused", "public": "connected"} {
		if codes[name] != want {
			t.Errorf("%s = %q, want %s\n%s", name, codes[name], want, out)
		}
	}
	var reason string
	eventually(t, 10*time.Second, "the violation is recorded", func() bool {
		reason = violationReasons(t, h, id)[publicHostIP]
		return reason != ""
	})
	if !strings.Contains(reason, publicHostIP) || !strings.Contains(reason, "address of this host") {
		t.Errorf("violation for %s: %q, want it to name the host's own address", publicHostIP, reason)
	}
}
