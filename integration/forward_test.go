package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// webServer is a runtime that serves its workspace over HTTP on port 8000
// of bind, until stopped.
func webServer(bind string) []string {
	return []string{"python3", "-m", "http.server", "--bind", bind, "8000"}
}

// get fetches http://address/index.txt, with a short timeout.
func get(address string) (string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + address + "/index.txt")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// forwardJSON is `session forward --json`'s output.
type forwardOut struct {
	Address  string
	HostPort int
	Port     int
	Detached bool
}

// startWeb makes agent name serving content from its workspace and starts
// a session of it; it returns the session id once the server answers
// inside (a detached forward is opened and closed to see it).
func startWeb(t *testing.T, home, name, strategy, bind, content string, extra ...string) string {
	t.Helper()
	ok(t, home, append(append([]string{"agent", "create", name, "--strategy", strategy}, extra...), append([]string{"--"}, webServer(bind)...)...)...)
	os.WriteFile(filepath.Join(agentDir(t, home, name), "workspace", "index.txt"), []byte(content), 0o644)
	return strings.TrimSpace(ok(t, home, "session", "start", name))
}

// waitServed waits until a GET through address returns want.
func waitServed(t *testing.T, address, want string, within time.Duration) {
	t.Helper()
	var got string
	var err error
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if got, err = get(address); err == nil && got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("GET through %s: %q, %v; want %q", address, got, err, want)
}

// attachedForward runs `session forward ID PORT` until the test stops it,
// and returns the command and the address it printed.
func attachedForward(t *testing.T, home, id, spec string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(agentconnect(), "--home", home, "session", "forward", id, spec, "--json")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var f forwardOut
	if err := json.NewDecoder(out).Decode(&f); err != nil || f.Address == "" {
		t.Fatalf("session forward printed %+v (%v)", f, err)
	}
	return cmd, f.Address
}

// refused reports whether nothing listens at address any more.
func refused(address string) bool {
	_, err := get(address)
	return err != nil && strings.Contains(err.Error(), "connection refused")
}

// TestSessionForwardSRT: a server the runtime started inside srt, on the
// sandbox's own loopback, is reached from the host's loopback through a
// forward; two sessions serve the same inner port through two host ports;
// a forward lasts as long as its command (Ctrl-C or SIGKILL), a detached
// one until unforward or the run's end; host sessions have nothing to
// forward; bad ports are refused.
func TestSessionForwardSRT(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	a := startWeb(t, home, "web-a", "srt", "127.0.0.1", "served by a\n")
	b := startWeb(t, home, "web-b", "srt", "127.0.0.1", "served by b\n")

	var fa, fb forwardOut
	okJSON(t, home, &fa, "session", "forward", a, "8000", "--detach")
	okJSON(t, home, &fb, "session", "forward", b, "8000", "--detach")
	if fa.Port != 8000 || !fa.Detached || !strings.HasPrefix(fa.Address, "127.0.0.1:") || fa.Address == fb.Address {
		t.Fatalf("forwards: %+v and %+v, want two loopback addresses for port 8000", fa, fb)
	}
	waitServed(t, fa.Address, "served by a\n", 20*time.Second)
	waitServed(t, fb.Address, "served by b\n", 20*time.Second)
	var listed []forwardOut
	okJSON(t, home, &listed, "session", "forwards", a)
	if len(listed) != 1 || listed[0].Address != fa.Address {
		t.Errorf("session forwards: %+v, want %s", listed, fa.Address)
	}

	// Attached: Ctrl-C ends it, and so does its command's death.
	cmd, addr := attachedForward(t, home, a, "8000")
	waitServed(t, addr, "served by a\n", 10*time.Second)
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Errorf("session forward after Ctrl-C: %v, want exit 0", err)
	}
	eventually(t, 10*time.Second, "the forward's listener closes after Ctrl-C", func() bool { return refused(addr) })
	cmd, addr = attachedForward(t, home, b, "8000")
	waitServed(t, addr, "served by b\n", 10*time.Second)
	cmd.Process.Kill()
	cmd.Wait()
	eventually(t, 10*time.Second, "the forward's listener closes after its command's SIGKILL", func() bool { return refused(addr) })

	// A supervisor restart: the detached forward stays; an attached one
	// ends with its command's stream, and the new supervisor closes it.
	cmd, addr = attachedForward(t, home, a, "8000")
	waitServed(t, addr, "served by a\n", 10*time.Second)
	ok(t, home, "restart")
	cmd.Wait()
	eventually(t, 10*time.Second, "an attached forward closes after a supervisor restart", func() bool { return refused(addr) })
	waitServed(t, fa.Address, "served by a\n", 10*time.Second)

	// Unforward, and the run's end.
	hostPort := strings.TrimPrefix(fa.Address, "127.0.0.1:")
	ok(t, home, "session", "unforward", a, hostPort)
	eventually(t, 10*time.Second, "unforward closes the listener", func() bool { return refused(fa.Address) })
	if r := run(t, home, "", "session", "unforward", a, hostPort); r.code == 0 || !strings.Contains(r.stderr, "no forward") {
		t.Errorf("unforward of a closed forward: exit %d, %q", r.code, r.stderr)
	}
	ok(t, home, "session", "stop", b)
	eventually(t, 10*time.Second, "the run's end closes its forwards", func() bool { return refused(fb.Address) })
	if r := run(t, home, "", "session", "forward", b, "8000"); r.code == 0 || !strings.Contains(r.stderr, "not running") {
		t.Errorf("a forward into a stopped session: exit %d, %q", r.code, r.stderr)
	}

	for _, spec := range []string{"0", "70000", "x:80", "80:", "1:2:3"} {
		if r := run(t, home, "", "session", "forward", a, spec); r.code == 0 || !strings.Contains(r.stderr, "want PORT or HOSTPORT:PORT") {
			t.Errorf("forward %s: exit %d, %q", spec, r.code, r.stderr)
		}
	}
	ok(t, home, "agent", "create", "onhost", "--strategy", "host", "--", "sleep", "60")
	h := strings.TrimSpace(ok(t, home, "session", "start", "onhost"))
	if r := run(t, home, "", "session", "forward", h, "8000"); r.code == 0 || !strings.Contains(r.stderr, "host's own network") {
		t.Errorf("a forward into a host session: exit %d, %q", r.code, r.stderr)
	}
}

// TestSessionForwardMicrosandbox: a server in the guest (on all its
// addresses) is reached through a forward, by the VM's network.
func TestSessionForwardMicrosandbox(t *testing.T) {
	requireMicrosandbox(t)
	h, _ := startVMDaemon(t, "")
	id := startWeb(t, h, "vmweb", "microsandbox", "0.0.0.0", "served by the guest\n")
	var f forwardOut
	okJSON(t, h, &f, "session", "forward", id, "8000", "--detach")
	waitServed(t, f.Address, "served by the guest\n", 3*time.Minute)
	ok(t, h, "session", "stop", id)
	eventually(t, 30*time.Second, "the VM's end closes its forwards", func() bool { return refused(f.Address) })
}
