package proxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/strategy/srt/proxy"
)

// startHold runs a TCP server on 127.0.0.1 that echoes what it reads (or,
// with echo false, drops it) and closes a connection only after its client
// closed; it reports each connection's end on the returned channel.
func startHold(t *testing.T, echo bool) (port int, ended <-chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				var w io.Writer = c
				if !echo {
					w = io.Discard
				}
				_, err := io.Copy(w, c)
				c.Close()
				select {
				case ch <- err:
				default:
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return portOf(t, l.Addr().String()), ch
}

// openTunnel makes a CONNECT tunnel through the proxy and checks that it
// echoes.
func openTunnel(t *testing.T, e *env, target string) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c := dialProxy(t, e)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s = %v, %v; want 200", target, resp, err)
	}
	echoOnce(t, c, br, "ping")
	return c, br
}

func echoOnce(t *testing.T, c net.Conn, br *bufio.Reader, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
		t.Fatalf("tunnel echoed %q, %v; want %q", got, err, msg)
	}
}

// TestConnectionCap opens MaxConns tunnels and checks that the next
// connection is refused, HTTP with a 503 that says why and SOCKS5 by a close,
// while the open ones keep working; once one closes, a new one is served.
func TestConnectionCap(t *testing.T) {
	port, _ := startHold(t, true)
	target := fmt.Sprintf("hold.test:%d", port)
	var mu sync.Mutex
	var logs []string
	const max = 3
	e := startProxy(t, []string{target}, nil, map[string][]netip.Addr{"hold.test": loopback()}, func(s *proxy.Server) {
		s.MaxConns = max
		s.Logf = func(format string, args ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(format, args...))
			mu.Unlock()
			t.Logf(format, args...)
		}
	})
	type tunnel struct {
		c  *net.TCPConn
		br *bufio.Reader
	}
	var open []tunnel
	for range max {
		c, br := openTunnel(t, e, target)
		open = append(open, tunnel{c, br})
	}

	resp, body := rawHTTP(t, e, "CONNECT "+target+" HTTP/1.1\r\n\r\n")
	if resp.StatusCode != 503 || !strings.Contains(body, fmt.Sprintf("already serves %d connections of this session", max)) {
		t.Errorf("connection %d: %d %q, want 503 naming the cap", max+1, resp.StatusCode, body)
	}
	socks := dialProxy(t, e)
	socks.Write([]byte{5, 1, 0})
	// Closed or reset are both a refusal; an answer or a hang is not.
	if b, err := io.ReadAll(socks); len(b) != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("SOCKS5 connection %d: read %q, %v; want it closed unanswered", max+1, b, err)
	}
	for i, tn := range open {
		echoOnce(t, tn.c, tn.br, fmt.Sprintf("still %d", i))
	}
	mu.Lock()
	logged := strings.Join(logs, "\n")
	mu.Unlock()
	if !strings.Contains(logged, "refused 1 connection(s): the proxy already serves 3 connections") {
		t.Errorf("log:\n%s\nwant a line about the refusal", logged)
	}

	// A closed tunnel frees its slot (once the proxy has noticed).
	open[0].c.Close()
	for i := 0; ; i++ {
		c := dialProxy(t, e)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if resp.StatusCode == 200 {
			break
		}
		if i == 100 {
			t.Fatalf("after a tunnel closed, CONNECT = %d %d times, want 200", resp.StatusCode, i+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIdleTimeoutClosesTunnel leaves a tunnel idle: the proxy closes both of
// its ends.
func TestIdleTimeoutClosesTunnel(t *testing.T) {
	port, ended := startHold(t, true)
	target := fmt.Sprintf("hold.test:%d", port)
	for _, proto := range []string{"connect", "socks5"} {
		t.Run(proto, func(t *testing.T) {
			e := startProxy(t, []string{target}, nil, map[string][]netip.Addr{"hold.test": loopback()},
				func(s *proxy.Server) { s.IdleTimeout = 100 * time.Millisecond })
			var c net.Conn
			var br *bufio.Reader
			if proto == "connect" {
				c, br = openTunnel(t, e, target)
			} else {
				sc := dialProxy(t, e)
				req := []byte{5, 1, 0, 5, 1, 0, 3, byte(len("hold.test"))}
				req = append(append(req, "hold.test"...), byte(port>>8), byte(port))
				sc.Write(req)
				br = bufio.NewReader(sc)
				reply := make([]byte, 2+10)
				if _, err := io.ReadFull(br, reply); err != nil || reply[3] != 0 {
					t.Fatalf("SOCKS5 CONNECT reply %v, %v; want success", reply, err)
				}
				c = sc
				echoOnce(t, c, br, "ping")
			}
			// Nothing more is sent either way: the proxy must end the tunnel
			// long before the test's own read deadline.
			if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
				t.Errorf("idle tunnel: read %q, %v; want the proxy to close it", b, err)
			}
			select {
			case <-ended: // the origin's side was closed too
			case <-time.After(ioTimeout):
				t.Error("the origin's connection stayed open")
			}
		})
	}
}

// TestIdleTimeoutClosesForward: an origin that accepts a forwarded request
// and never answers does not hold the client forever.
func TestIdleTimeoutClosesForward(t *testing.T) {
	port, ended := startHold(t, false)
	e := startProxy(t, []string{fmt.Sprintf("hold.test:%d", port)}, nil, map[string][]netip.Addr{"hold.test": loopback()},
		func(s *proxy.Server) { s.IdleTimeout = 100 * time.Millisecond })
	c := dialProxy(t, e)
	fmt.Fprintf(c, "GET http://hold.test:%d/ HTTP/1.1\r\nHost: hold.test\r\n\r\n", port)
	if b, err := io.ReadAll(c); err != nil {
		t.Errorf("forward to a silent origin: read %q, %v; want the proxy to close it", b, err)
	}
	select {
	case <-ended:
	case <-time.After(ioTimeout):
		t.Error("the origin's connection stayed open")
	}
}
