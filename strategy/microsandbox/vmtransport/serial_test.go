package vmtransport

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These tests run both halves of the serial transport in one process, with a
// unix socket standing for QEMU's chardev socket: the host side dials it, and
// each time the guest side opens its port it gets the next connection
// accepted from it. What they cannot cover is the virtio-serial device itself
// (waitHost, reopening /dev/vportNpM); the boot test in vmagent does.

type fakeQEMU struct {
	path string
	ln   net.Listener
}

func newFakeQEMU(t *testing.T) *fakeQEMU {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &fakeQEMU{path: path, ln: ln}
}

// guest serves the guest side on q and returns its listener.
func (q *fakeQEMU) guest(t *testing.T, opts ...Option) net.Listener {
	t.Helper()
	open := func() (io.ReadWriteCloser, error) { return q.ln.Accept() }
	l := newSerialListener("fake", open, buildOptions(append([]Option{WithLogf(t.Logf)}, opts...)))
	t.Cleanup(func() { l.Close() })
	return l
}

func (q *fakeQEMU) host(t *testing.T, opts ...Option) *SerialClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewSerialClient(ctx, q.path, append([]Option{WithLogf(t.Logf)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// serveTestStreams answers the host's streams by their preface:
// "stdin ID": reads to end of file and replies "LEN SHA256\n";
// "stdout nSIZE": writes SIZE bytes of data(SIZE);
// "ttrpc": echoes.
func serveTestStreams(t *testing.T, l net.Listener) {
	// Errors of a stream whose session went away (a test may end it on
	// purpose) are not the guest's; every handler is done before the test
	// is, so that none reports after it.
	report := func(format string, err error, args ...any) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe) || strings.Contains(err.Error(), "shutdown") {
			return
		}
		t.Errorf(format, append(args, err)...)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		l.Close() // ends the guest's streams, and with them the handlers
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				kind, id, err := ReadPreface(c)
				if err != nil {
					report("guest: %v", err)
					return
				}
				switch kind {
				case KindStdin:
					h := sha256.New()
					n, err := io.Copy(h, c)
					if err != nil {
						report("guest: read stdin %s: %v", err, id)
					}
					fmt.Fprintf(c, "%d %x\n", n, h.Sum(nil))
				case KindStdout:
					size, _ := strconv.ParseInt(strings.TrimPrefix(id, "n"), 10, 64)
					if _, err := io.Copy(c, data(size)); err != nil {
						report("guest: write stdout %s: %v", err, id)
					}
				case KindTTRPC:
					io.Copy(c, c)
				}
			}()
		}
	}()
}

// data is size deterministic pseudo-random bytes.
func data(size int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{byte(size), byte(size >> 8), byte(size >> 16)}), size)
}

func digest(r io.Reader) (int64, string) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	return n, fmt.Sprintf("%x", h.Sum(nil))
}

func dial(t *testing.T, c *SerialClient, kind, id string) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePreface(conn, kind, id); err != nil {
		t.Fatal(err)
	}
	return conn
}

// sendStdin writes size bytes as the stdin stream, half-closes it and
// checks the guest's summary of what arrived.
func sendStdin(t *testing.T, c *SerialClient, id string, size int64) {
	conn := dial(t, c, KindStdin, id)
	defer conn.Close()
	wantN, wantSum := digest(data(size))
	if _, err := io.Copy(conn, data(size)); err != nil {
		t.Errorf("write stdin %s: %v", id, err)
		return
	}
	conn.Close() // half-close: the guest reads end of file, and can still answer
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Errorf("read the guest's summary of %s: %v", id, err)
		return
	}
	if want := fmt.Sprintf("%d %s\n", wantN, wantSum); line != want {
		t.Errorf("guest got stdin %s as %q, want %q", id, line, want)
	}
}

func readStdout(t *testing.T, c *SerialClient, size int64) {
	conn := dial(t, c, KindStdout, fmt.Sprintf("n%d", size))
	defer conn.Close()
	gotN, gotSum := digest(conn)
	wantN, wantSum := digest(data(size))
	if gotN != wantN || gotSum != wantSum {
		t.Errorf("stdout of %d bytes = %d bytes %s, want %d bytes %s", size, gotN, gotSum, wantN, wantSum)
	}
}

func TestSerialConcurrentStreams(t *testing.T) {
	q := newFakeQEMU(t)
	serveTestStreams(t, q.guest(t))
	c := q.host(t)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(3)
		go func() {
			defer wg.Done()
			sendStdin(t, c, fmt.Sprintf("p%d", i), int64(1000*i))
		}()
		go func() {
			defer wg.Done()
			readStdout(t, c, int64(1000*i+1))
		}()
		go func() {
			defer wg.Done()
			conn := dial(t, c, KindTTRPC, "")
			defer conn.Close()
			msg := fmt.Sprintf("hello %d\n", i)
			io.WriteString(conn, msg)
			got, err := bufio.NewReader(conn).ReadString('\n')
			if got != msg || err != nil {
				t.Errorf("echo = %q, %v; want %q", got, err, msg)
			}
		}()
	}
	wg.Wait()
}

func TestSerialLargeTransfersBothWays(t *testing.T) {
	q := newFakeQEMU(t)
	serveTestStreams(t, q.guest(t))
	c := q.host(t)
	const size = 16 << 20
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); sendStdin(t, c, "big", size) }()
	go func() { defer wg.Done(); readStdout(t, c, size) }()
	wg.Wait()
}

func TestSerialEmptyStdinEOFCrosses(t *testing.T) {
	q := newFakeQEMU(t)
	serveTestStreams(t, q.guest(t))
	sendStdin(t, q.host(t), "empty", 0)
}

func TestSerialHostReconnects(t *testing.T) {
	q := newFakeQEMU(t)
	serveTestStreams(t, q.guest(t))
	first := q.host(t)
	readStdout(t, first, 10)
	old := dial(t, first, KindTTRPC, "")
	first.Close() // the shim restarts
	if _, err := old.Write([]byte("x")); err == nil {
		t.Error("a stream of the closed session still accepts writes")
	}
	second := q.host(t)
	readStdout(t, second, 100000)
	sendStdin(t, second, "again", 5000)
}

func TestSerialSkipsStaleBytes(t *testing.T) {
	q := newFakeQEMU(t)
	serveTestStreams(t, q.guest(t))
	// A previous host left half a session in the port, hello-like bytes
	// included; the guest must skip it all.
	stale, err := net.Dial("unix", q.path)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(stale, "\x00\x01garbage\nagentconnect-serial v1 ho\n\nagentconnect")
	// The guest reads a connection at a time: let it reach the stale one.
	conn, err := net.Dial("unix", q.path)
	if err != nil {
		t.Fatal(err)
	}
	stale.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	io.WriteString(conn, "more stale bytes\n\nagentconnect-serial")
	c, err := newSerialClient(ctx, conn, buildOptions([]Option{WithLogf(t.Logf)}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	readStdout(t, c, 1234)
}

func TestSkipTo(t *testing.T) {
	tests := []struct {
		in   string
		rest string
	}{
		{hostHello + "x", "x"},
		{"junk" + hostHello + "x", "x"},
		{"\n\n\n" + hostHello[1:] + "x", "x"},
		{hostHello[:10] + hostHello + "x", "x"},
		{guestHello + hostHello + "x", "x"},
	}
	for _, tt := range tests {
		r := bufio.NewReader(strings.NewReader(tt.in))
		if err := skipTo(r, hostHello); err != nil {
			t.Errorf("skipTo(%q) = %v", tt.in, err)
			continue
		}
		if rest, _ := io.ReadAll(r); string(rest) != tt.rest {
			t.Errorf("skipTo(%q) left %q, want %q", tt.in, rest, tt.rest)
		}
	}
	if err := skipTo(bufio.NewReader(strings.NewReader(hostHello[:20])), hostHello); err != io.EOF {
		t.Errorf("skipTo of a cut hello = %v, want EOF", err)
	}
}

func TestSerialGuestGoesAway(t *testing.T) {
	q := newFakeQEMU(t)
	guest := q.guest(t)
	serveTestStreams(t, guest)
	c := q.host(t)
	conn := dial(t, c, KindTTRPC, "")
	guest.Close() // the VM is gone
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the host session did not end after the guest went away")
	}
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Error("a stream still reads after the guest went away")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := DialWithRetry(ctx, c, 10*time.Millisecond)
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("DialWithRetry on a dead session = %v, want net.ErrClosed", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("DialWithRetry on a dead session took %v, want it to give up at once", d)
	}
}

func TestSerialKeepaliveDetectsWedgedGuest(t *testing.T) {
	q := newFakeQEMU(t)
	// A guest that answers the hello and then never reads nor writes again.
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		conn, err := q.ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		skipTo(bufio.NewReader(conn), hostHello)
		io.WriteString(conn, guestHello)
		<-stop
	}()
	c := q.host(t, WithKeepAlive(50*time.Millisecond, 200*time.Millisecond))
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("keepalive did not end the session with a wedged guest")
	}
}

func TestNewSerialClientWaitsForSocketAndGuest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "late.sock")
	ready := make(chan net.Listener, 1)
	go func() {
		time.Sleep(300 * time.Millisecond) // QEMU starting
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Error(err)
			ready <- nil
			return
		}
		ready <- ln
		time.Sleep(300 * time.Millisecond) // the guest booting
		q := &fakeQEMU{path: path, ln: ln}
		serveTestStreams(t, q.guest(t))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := NewSerialClient(ctx, path, WithLogf(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ln := <-ready; ln != nil {
		defer ln.Close()
	}
	t.Logf("connected after %v", time.Since(start))
	readStdout(t, c, 99)
}

func TestNewSerialClientGivesUp(t *testing.T) {
	// No socket at all.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := NewSerialClient(ctx, filepath.Join(t.TempDir(), "none.sock"))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("NewSerialClient without a socket = %v, want a deadline error naming the missing socket", err)
	}
	// A socket whose guest never answers.
	q := newFakeQEMU(t)
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = NewSerialClient(ctx, q.path)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "guest agent") {
		t.Errorf("NewSerialClient with a silent guest = %v, want a deadline error about the guest agent", err)
	}
}

func TestFindSerialPort(t *testing.T) {
	root := t.TempDir()
	sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
	for name, port := range map[string]string{"vport1p1": "other", "vport1p2": "agentconnect"} {
		os.MkdirAll(filepath.Join(sys, name), 0o755)
		os.WriteFile(filepath.Join(sys, name, "name"), []byte(port+"\n"), 0o644)
	}
	os.MkdirAll(filepath.Join(sys, "vport1p3"), 0o755) // no name yet
	os.MkdirAll(dev, 0o755)
	os.WriteFile(filepath.Join(dev, "vport1p2"), nil, 0o644)
	got, err := findSerialPort(sys, dev, "agentconnect")
	if want := filepath.Join(dev, "vport1p2"); got != want || err != nil {
		t.Errorf("findSerialPort = %q, %v; want %q, nil", got, err, want)
	}
	if _, err := findSerialPort(sys, dev, "other"); err == nil {
		t.Error("findSerialPort found a port whose device node is missing")
	}
	if _, err := findSerialPort(sys, dev, "absent"); err == nil {
		t.Error("findSerialPort found an absent port")
	}
	if _, err := findSerialPort(filepath.Join(root, "nosys"), dev, "agentconnect"); err == nil {
		t.Error("findSerialPort succeeded without a sysfs directory")
	}
}

// socketpair returns the two ends of a unix stream socketpair.
func socketpair(t *testing.T) (host net.Conn, guest *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hf := os.NewFile(uintptr(fds[0]), "host")
	host, err = net.FileConn(hf)
	hf.Close()
	if err != nil {
		t.Fatal(err)
	}
	return host, os.NewFile(uintptr(fds[1]), "guest")
}

func TestSerialOverSocketpair(t *testing.T) {
	host, guest := socketpair(t)
	l := ListenSerialConn(guest, WithLogf(t.Logf))
	defer l.Close()
	serveTestStreams(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := NewSerialClientConn(ctx, host, WithLogf(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(2)
		go func() { defer wg.Done(); sendStdin(t, c, fmt.Sprintf("s%d", i), 3<<20) }()
		go func() { defer wg.Done(); readStdout(t, c, 3<<20+int64(i)) }()
	}
	wg.Wait()
	// The host goes away: a port that cannot be reopened ends the listener.
	c.Close()
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after the host left = %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the listener still accepts after its only session ended")
	}
}
