package integration

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/testdns"
)

// publicNet is a network namespace the test makes to stand for the public
// internet: a veth pair, 192.31.196.1 on the host's side and 192.31.196.2
// inside, where an HTTP server answers on port 8080. 192.31.196.0/24 is
// AS112's (RFC 7534), which the registries mark globally reachable, so the
// policy treats it as public; while the test runs the host routes it into
// the namespace, so no real network is reached. The same server answers on a private address,
// 10.199.0.2, which the policy refuses without an entry.
type publicNet struct {
	name string
	srv  *exec.Cmd
}

const (
	publicHostIP    = "192.31.196.1"
	publicServerIP  = "192.31.196.2"
	publicPort      = 8080
	privateHostIP   = "10.199.0.1"
	privateServerIP = "10.199.0.2"
)

func startPublicNet(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed (make deps installs it)")
	}
	p := &publicNet{name: fmt.Sprintf("acpub%d", os.Getpid()%100000)}
	host, peer := p.name+"h", p.name+"p"
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	sh("netns", "add", p.name)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", p.name).Run() })
	sh("link", "add", host, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { exec.Command("ip", "link", "delete", host).Run() })
	sh("link", "set", peer, "netns", p.name)
	sh("addr", "add", publicHostIP+"/24", "dev", host)
	sh("addr", "add", privateHostIP+"/24", "dev", host)
	sh("link", "set", host, "up")
	sh("-n", p.name, "addr", "add", publicServerIP+"/24", "dev", peer)
	sh("-n", p.name, "addr", "add", privateServerIP+"/24", "dev", peer)
	sh("-n", p.name, "link", "set", peer, "up")
	sh("-n", p.name, "link", "set", "lo", "up")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "index.html"), []byte("public hello\n"), 0o644)
	p.srv = exec.Command("ip", "netns", "exec", p.name, "python3", "-m", "http.server", strconv.Itoa(publicPort),
		"--directory", dir)
	if err := p.srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.srv.Process.Kill(); p.srv.Wait() })
	url := fmt.Sprintf("http://%s:%d/", publicServerIP, publicPort)
	eventually(t, 20*time.Second, "the public server answers", func() bool {
		c := http.Client{Timeout: time.Second}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
}

// netScript prints "NAME CODE" for each request an srt session makes through
// its proxy: curl's HTTP status, or 000 when the connection failed.
const netScript = `
get() { n=$1; shift; printf '%s %s\n' "$n" "$(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --noproxy '' "$@")"; }
raw() { n=$1; if python3 -c "import socket; socket.create_connection(('$2', $3), 3)" 2>/dev/null; then echo "$n connected"; else echo "$n refused"; fi; }
`

// parseCodes maps the "NAME RESULT" lines of a session's output to the
// results.
func parseCodes(out string) map[string]string {
	codes := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if name, code, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			codes[name] = code
		}
	}
	return codes
}

func TestSRTNetworkPolicy(t *testing.T) {
	requireBwrap(t)
	startPublicNet(t)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "loopback plain") }))
	defer plain.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "loopback tls") }))
	defer tlsSrv.Close()
	plainPort := plain.Listener.Addr().(*net.TCPAddr).Port
	tlsPort := tlsSrv.Listener.Addr().(*net.TCPAddr).Port
	dns := testdns.Start(t, map[string][]netip.Addr{
		"public.test":  {netip.MustParseAddr(publicServerIP)},
		"blocked.test": {netip.MustParseAddr(publicServerIP)},
		"sneaky.test":  {netip.MustParseAddr("127.0.0.1")},
	})

	home := newHome(t)
	os.WriteFile(filepath.Join(home, "config.json"), []byte(`{"sandbox": {"srt": {"resolver": "`+dns+`"}}}`), 0o600)
	startDaemon(t, home)

	// An agent whose allowlist opens two loopback servers, and nothing else.
	ok(t, home, "agent", "create", "local", "--strategy", "srt",
		"--allow-domain", fmt.Sprintf("127.0.0.1:%d", plainPort), "--allow-domain", fmt.Sprintf("127.0.0.1:%d", tlsPort), "--", "true")
	caFile := filepath.Join(agentDir(t, home, "local"), "workspace", "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}), 0o644)
	ok(t, home, "agent", "edit", "local", "--", "sh", "-c", netScript+fmt.Sprintf(`
get plain-by-entry -x "$HTTP_PROXY" http://127.0.0.1:%d/
get tls-by-entry -x "$HTTP_PROXY" --cacert ca.pem https://127.0.0.1:%d/
get public-not-listed -x "$HTTP_PROXY" http://public.test:%d/
`, plainPort, tlsPort, publicPort))
	r := run(t, home, "", "exec", "local")
	codes := parseCodes(r.stdout)
	for name, want := range map[string]string{"plain-by-entry": "200", "tls-by-entry": "200", "public-not-listed": "403"} {
		if codes[name] != want {
			t.Errorf("agent with an allowlist: %s = %q, want %s\n%s%s", name, codes[name], want, r.stdout, r.stderr)
		}
	}

	// An agent with no allowlist: public destinations by default, loopback
	// and private never without an entry, a denied name refused.
	ok(t, home, "agent", "create", "open", "--strategy", "srt", "--deny-domain", "blocked.test", "--", "sh", "-c",
		netScript+fmt.Sprintf(`
get public-http -x "$HTTP_PROXY" http://public.test:%[1]d/
get public-socks --socks5-hostname 127.0.0.1:1080 http://public.test:%[1]d/
get public-ip -x "$HTTP_PROXY" http://%[2]s:%[1]d/
get sneaky-http -x "$HTTP_PROXY" http://sneaky.test:%[3]d/
get sneaky-socks --socks5-hostname 127.0.0.1:1080 http://sneaky.test:%[3]d/
get loopback-ip -x "$HTTP_PROXY" http://127.0.0.1:%[3]d/
get denied -x "$HTTP_PROXY" http://blocked.test:%[1]d/
raw raw-public %[2]s %[1]d
raw raw-loopback 127.0.0.1 %[3]d
`, publicPort, publicServerIP, plainPort))
	r = run(t, home, "", "exec", "--keep", "open")
	codes = parseCodes(r.stdout)
	for name, want := range map[string]string{
		"public-http": "200", "public-socks": "200", "public-ip": "200",
		"sneaky-http": "403", "loopback-ip": "403", "denied": "403",
		"raw-public": "refused", "raw-loopback": "refused",
	} {
		if codes[name] != want {
			t.Errorf("agent without an allowlist: %s = %q, want %s\n%s%s", name, codes[name], want, r.stdout, r.stderr)
		}
	}
	if c := codes["sneaky-socks"]; c == "200" {
		t.Errorf("SOCKS5 to a name resolving to 127.0.0.1 = %s, want a failure", c)
	}

	// The refusals are on the session and in the events.
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls", "--agent", "open")
	if len(sessions) != 1 {
		t.Fatalf("sessions of open: %+v", sessions)
	}
	var shown struct {
		ViolationCount int `json:"violationCount"`
		Violations     []struct {
			Host   string `json:"host"`
			Reason string `json:"reason"`
		} `json:"violations"`
	}
	okJSON(t, home, &shown, "session", "show", sessions[0].ID)
	reasons := map[string]string{}
	for _, v := range shown.Violations {
		reasons[v.Host] = v.Reason
	}
	if shown.ViolationCount < 3 || !strings.Contains(reasons["blocked.test"], "deniedDomains") || !strings.Contains(reasons["sneaky.test"], "loopback") {
		t.Errorf("violations on the session: %+v", shown)
	}
	events := ok(t, home, "events", "--json")
	found := false
	for _, line := range strings.Split(strings.TrimSpace(events), "\n") {
		var e struct{ Type, SessionID, Message string }
		json.Unmarshal([]byte(line), &e)
		if e.Type == "session.violation" && e.SessionID == sessions[0].ID && strings.Contains(e.Message, "blocked.test") {
			found = true
		}
	}
	if !found {
		t.Errorf("no session.violation event for blocked.test:\n%s", events)
	}
}
