package integration

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// unixToolsScript runs, inside srt, what developer tools do with unix
// sockets of their own: Python's multiprocessing Manager, an asyncio unix
// server and client, a Node unix server and client, and (where the machine
// has one) a headless Chromium, which talks to its children over socket
// pairs and unix sockets.
const unixToolsScript = `
allow af-unix py 'socket.socket(socket.AF_UNIX)'
allow socketpair py 'socket.socketpair()'
allow abstract-own py 's=socket.socket(socket.AF_UNIX); s.bind("\0agentconnect-own"); s.listen(); c=socket.socket(socket.AF_UNIX); c.connect("\0agentconnect-own")'
allow py-manager timeout 60 python3 -c 'import multiprocessing as m
if __name__ == "__main__":
    with m.Manager() as mgr:
        d = mgr.dict(); d["k"] = 1; assert d["k"] == 1'
allow py-asyncio timeout 60 python3 -c '
import asyncio
async def main():
    async def handle(r, w):
        w.write(await r.readline()); await w.drain(); w.close()
    srv = await asyncio.start_unix_server(handle, "a.sock")
    r, w = await asyncio.open_unix_connection("a.sock")
    w.write(b"ping\n"); await w.drain()
    assert await r.readline() == b"ping\n"
    srv.close()
asyncio.run(main())'
allow node-unix timeout 60 node -e '
const net = require("net");
const srv = net.createServer(c => c.pipe(c)).listen("n.sock", () => {
  const c = net.connect("n.sock", () => c.write("ping"));
  c.on("data", d => { if (String(d) !== "ping") process.exit(1); c.end(); srv.close(); });
});'
`

// chromiumLine is the battery line for a headless Chromium, when the
// machine has one: its own sandbox needs a user namespace (none inside
// srt without nestedSandbox), the rest of it runs. Its singleton socket
// goes in the sandbox's own /tmp: the agent's TMPDIR under a test's home
// is longer than a unix socket path may be (108 bytes).
const chromiumLine = `allow chromium sh -c 'TMPDIR=/tmp timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --disable-background-networking --disable-component-update --disable-sync --user-data-dir=/tmp/chromium --dump-dom "data:text/html,<p>agentconnect-unix</p>" 2>/dev/null | grep -q agentconnect-unix'
`

// hostListener is a unix socket of a host process: where it is bound, and
// how it was made.
type hostListener struct {
	name, path string
	dgram      bool
}

// listenOnHost starts a python3 process that binds a unix socket at path
// (stream, listening, or datagram) under cmd's namespaces, and waits until
// it is bound; the process ends with the test. chdir, when set, is entered
// first and path is bound as given (relative).
func listenOnHost(t *testing.T, wrap []string, chdir, path string, dgram bool) {
	t.Helper()
	kind, listen := "socket.SOCK_STREAM", "s.listen()"
	if dgram {
		kind, listen = "socket.SOCK_DGRAM", "pass"
	}
	script := fmt.Sprintf(`import os, socket, sys, time
if sys.argv[2]: os.chdir(sys.argv[2])
s = socket.socket(socket.AF_UNIX, %s)
s.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o777)
%s
print("up", flush=True)
time.sleep(600)`, kind, listen)
	args := append(append([]string{}, wrap...), "python3", "-c", script, path, chdir)
	cmd := exec.Command(args[0], args[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "up\n" {
		t.Fatalf("the host socket %s did not come up: %q %v", path, line, err)
	}
}

// TestSRTUnixSockets: inside srt, the session's own unix sockets work (the
// tools above), and no host socket the sandbox's view would show can be
// reached, under a root daemon and an unprivileged one: pathname sockets in
// every place a host service could put one that the view shows, bound by
// name, by a relative name, under another mount namespace's name, from
// another network namespace, a datagram socket, one a host process bound in
// the agent's own workspace, and an abstract socket of the host. From the
// host, each is reachable (the control).
func TestSRTUnixSockets(t *testing.T) {
	requireRoot(t) // the host's service directories are root's
	requireBwrap(t)
	var socks []hostListener
	var places []string
	for _, base := range []string{"/var/lib", "/var/spool", "/usr/local", "/opt", "/srv"} {
		if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
			continue
		}
		dir, err := os.MkdirTemp(base, "agentconnect-sock-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		os.Chmod(dir, 0o755)
		places = append(places, dir)
		name := strings.ReplaceAll(strings.TrimPrefix(base, "/"), "/", "-")
		socks = append(socks, hostListener{name: name, path: filepath.Join(dir, "s.sock")})
	}
	if len(places) == 0 {
		t.Fatal("none of the host's service directories exists")
	}
	first := places[0]
	socks = append(socks,
		hostListener{name: "dgram", path: filepath.Join(first, "d.sock"), dgram: true},
		hostListener{name: "relative", path: filepath.Join(first, "rel.sock")},
		hostListener{name: "other-netns", path: filepath.Join(first, "netns.sock")},
		hostListener{name: "other-mountns", path: filepath.Join(first, "mntns.sock")},
	)
	alias := filepath.Join(t.TempDir(), "alias")
	os.Mkdir(alias, 0o755)
	for _, s := range socks {
		switch s.name {
		case "relative":
			listenOnHost(t, nil, first, "rel.sock", false)
		case "other-netns":
			listenOnHost(t, []string{"unshare", "--net"}, "", s.path, false)
		case "other-mountns":
			// Bound through a bind of first at another path, in a mount
			// namespace of its own: its name leads nowhere on the host.
			listenOnHost(t, []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" "$1" && shift && exec "$@"`, first, alias},
				"", filepath.Join(alias, "mntns.sock"), false)
		default:
			listenOnHost(t, nil, "", s.path, s.dgram)
		}
	}
	abstract := fmt.Sprintf("agentconnect-host-%d", time.Now().UnixNano())
	al, err := net.Listen("unix", "@"+abstract)
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()

	t.Run("root", func(t *testing.T) {
		home := newHome(t)
		startDaemon(t, home)
		checkUnixSockets(t, home, socks, abstract)
	})
	t.Run("unprivileged", func(t *testing.T) {
		home := nobodyHome(t)
		d := &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
		d.start()
		t.Cleanup(d.cleanup)
		checkUnixSockets(t, home, socks, abstract)
	})
}

// checkUnixSockets runs the battery in an srt session of the daemon at
// home, with host listeners socks and one more in the agent's workspace.
func checkUnixSockets(t *testing.T, home string, socks []hostListener, abstract string) {
	ok(t, home, "agent", "create", "socks", "--strategy", "srt", "--", "true")
	ws := filepath.Join(agentDir(t, home, "socks"), "workspace")
	inWS := hostListener{name: "in-workspace", path: filepath.Join(ws, "host.sock")}
	listenOnHost(t, nil, "", inWS.path, false)
	socks = append(socks[:len(socks):len(socks)], inWS)

	// The control: each is reachable from the host.
	for _, s := range socks {
		network := "unix"
		if s.dgram {
			network = "unixgram"
		}
		c, err := net.Dial(network, s.path)
		if err != nil {
			t.Fatalf("the control: %s (%s) is not reachable from the host: %v", s.name, s.path, err)
		}
		c.Close()
	}

	script := batteryFuncs + `py() { python3 -c "import socket, sys; $1"; }` + "\n"
	for _, s := range socks {
		if s.dgram {
			script += fmt.Sprintf("deny host-%s py 's=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(b\"x\", \"%s\")'\n", s.name, s.path)
		} else {
			script += fmt.Sprintf("deny host-%s py 's=socket.socket(socket.AF_UNIX); s.connect(\"%s\")'\n", s.name, s.path)
		}
	}
	script += fmt.Sprintf("deny host-abstract py 's=socket.socket(socket.AF_UNIX); s.connect(\"\\0%s\")'\n", abstract)
	script += unixToolsScript
	if _, err := exec.LookPath("chromium"); err == nil {
		script += chromiumLine
	} else {
		t.Log("no chromium here: the Chromium line is left out (make deps installs it)")
	}
	script += "echo done\n"
	ok(t, home, "agent", "edit", "socks", "--", "sh", "-c", script)
	r := run(t, home, "", "exec", "socks")
	if r.code != 0 || !strings.Contains(r.stdout, "done") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	verdicts(t, script, r.stdout)
}
