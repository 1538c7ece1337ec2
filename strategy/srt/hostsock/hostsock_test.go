package hostsock

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBound: a listening stream socket and a bound datagram socket are
// listed with their names and their files' identities; an abstract one is
// not (it belongs to this network namespace); a relative name is listed as
// bound.
func TestBound(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", stream)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dgram := filepath.Join(dir, "d.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: dgram, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	abstract, err := net.Listen("unix", "@agentconnect-hostsock-test")
	if err != nil {
		t.Fatal(err)
	}
	defer abstract.Close()
	wd, _ := os.Getwd()
	os.Chdir(dir)
	rel, err := net.Listen("unix", "r.sock")
	os.Chdir(wd)
	if err != nil {
		t.Fatal(err)
	}
	defer rel.Close()

	socks, err := Bound()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Socket{}
	for _, s := range socks {
		byName[s.Name] = s
		if s.Name == "@agentconnect-hostsock-test" || s.Name == "\x00agentconnect-hostsock-test" {
			t.Errorf("an abstract socket was listed: %+v", s)
		}
	}
	for name, path := range map[string]string{stream: stream, dgram: dgram, "r.sock": filepath.Join(dir, "r.sock")} {
		s, ok := byName[name]
		if !ok {
			t.Errorf("%s is not listed", name)
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		if s.Dev != st.Dev || s.Ino != st.Ino {
			t.Errorf("%s: dev %d ino %d, want %d %d", name, s.Dev, s.Ino, st.Dev, st.Ino)
		}
	}
}

// TestBoundEverywhere: as root, a socket bound by a process in another
// network namespace (a container's, say) is listed too.
func TestBoundEverywhere(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering another network namespace needs root")
	}
	path := filepath.Join(t.TempDir(), "other-netns.sock")
	cmd := exec.Command("unshare", "--net", "python3", "-c",
		`import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); print("up", flush=True); time.sleep(30)`, path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("the socket in the other namespace did not come up: %v", err)
	}
	has := func(socks []Socket) bool {
		for _, s := range socks {
			if s.Name == path {
				return true
			}
		}
		return false
	}
	if here, err := Bound(); err != nil || has(here) {
		t.Fatalf("Bound: %v, or it lists another namespace's socket", err)
	}
	all, err := BoundEverywhere()
	if err != nil {
		t.Fatal(err)
	}
	if !has(all) {
		t.Errorf("BoundEverywhere does not list %s", path)
	}
	// What a daemon that cannot enter the namespace reads instead: the
	// names in its /proc/PID/net/unix (the unshared python's).
	names, err := namesIn(fmt.Sprintf("/proc/%d/net/unix", pythonPid(t, cmd.Process.Pid)))
	if err != nil || !has(names) {
		t.Errorf("namesIn: %v, %v; want %s", names, err, path)
	}
}

// pythonPid is the pid of unshare's child (unshare forks for --net only
// with --fork; otherwise it execs in place).
func pythonPid(t *testing.T, pid int) int {
	t.Helper()
	if kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		if f := strings.Fields(string(kids)); len(f) > 0 {
			if child, err := strconv.Atoi(f[0]); err == nil {
				return child
			}
		}
	}
	return pid
}

func TestNamesIn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "unix")
	os.WriteFile(path, []byte("Num       RefCount Protocol Flags    Type St Inode Path\n"+
		"0000000074575794: 00000002 00000000 00010000 0001 01 572217 /srv/a b.sock\n"+
		"0000000074575795: 00000002 00000000 00010000 0001 01 572218 @abstract\n"+
		"0000000074575796: 00000003 00000000 00000000 0001 03 572219\n"+
		"0000000074575797: 00000002 00000000 00010000 0005 01 572220 rel.sock\n"), 0o644)
	socks, err := namesIn(path)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(socks) != "[{/srv/a b.sock 0 0 0} {rel.sock 0 0 0}]" {
		t.Errorf("namesIn = %v", socks)
	}
}
