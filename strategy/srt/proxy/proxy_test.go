package proxy_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
	"github.com/agentconnect-md/agentconnect/strategy/srt/proxy"
)

// ioTimeout bounds every read and write a test does, so a bug fails the test
// instead of hanging it.
const ioTimeout = 10 * time.Second

// testNet stands for the public internet: tests resolve "public" names into
// it and the test dialer sends those connections to the same port on
// 127.0.0.1.
var testNet = netip.MustParsePrefix("192.31.196.0/24")

type fakeResolver struct {
	records map[string][]netip.Addr
	lookups atomic.Int64
}

func (r *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.lookups.Add(1)
	if network != "ip" {
		return nil, fmt.Errorf("fake resolver: unexpected network %q", network)
	}
	addrs, ok := r.records[strings.ToLower(strings.TrimSuffix(host, "."))]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(addrs), nil
}

type env struct {
	addr     string // the proxy's listening address
	srv      *proxy.Server
	resolver *fakeResolver

	mu         sync.Mutex // guards the fields that follow
	violations []netpolicy.Violation
	dialed     []string
}

func (e *env) Violations() []netpolicy.Violation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.violations)
}

func (e *env) Dialed() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.dialed)
}

// startProxy serves a proxy with the given policy and DNS records on
// 127.0.0.1 until the test ends. Its dialer records each address and only
// reaches loopback (testNet addresses are sent to 127.0.0.1).
func startProxy(t *testing.T, allowed, denied []string, records map[string][]netip.Addr, opts ...func(*proxy.Server)) *env {
	t.Helper()
	p, err := netpolicy.New(allowed, denied)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{resolver: &fakeResolver{records: records}}
	e.srv = &proxy.Server{
		Policy:   p,
		Resolver: e.resolver,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			e.mu.Lock()
			e.dialed = append(e.dialed, addr)
			e.mu.Unlock()
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, fmt.Errorf("test dialer: %q is not ip:port", addr)
			}
			if testNet.Contains(ap.Addr()) {
				ap = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port())
			}
			if !ap.Addr().IsLoopback() {
				return nil, fmt.Errorf("test dialer: refusing non-loopback %s", ap)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, ap.String())
		},
		OnViolation: func(v netpolicy.Violation) {
			e.mu.Lock()
			e.violations = append(e.violations, v)
			e.mu.Unlock()
		},
		Logf: t.Logf,
	}
	for _, o := range opts {
		o(e.srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = l.Addr().String()
	serveUntilCleanup(t, e.srv, l)
	return e
}

func serveUntilCleanup(t *testing.T, srv *proxy.Server, l net.Listener) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		l.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve = %v, want nil after the listener closed", err)
			}
		case <-time.After(ioTimeout):
			t.Errorf("Serve did not return within %v of the listener closing", ioTimeout)
		}
	})
}

func loopback() []netip.Addr { return []netip.Addr{netip.MustParseAddr("127.0.0.1")} }

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// startEcho runs a TCP server on 127.0.0.1 that echoes each connection until
// EOF, then half-closes it.
func startEcho(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
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
				c.SetDeadline(time.Now().Add(ioTimeout))
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	return l
}

func dialProxy(t *testing.T, e *env) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", e.addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(ioTimeout))
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// rawHTTP sends payload on a new connection and reads one response.
func rawHTTP(t *testing.T, e *env, payload string) (*http.Response, string) {
	t.Helper()
	c := dialProxy(t, e)
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", firstLine(payload), err)
	}
	if strings.HasPrefix(payload, "CONNECT ") && resp.StatusCode == 200 {
		return resp, "" // the tunnel follows, not a body
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(body)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

func httpClient(t *testing.T, proxyURL string, tlsConf *tls.Config) *http.Client {
	t.Helper()
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: tlsConf, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: ioTimeout}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", u, err)
	}
	return resp.StatusCode, string(b)
}

func TestConnectTLS(t *testing.T) {
	origin := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "secure hello from "+r.Host)
	}))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	// The httptest certificate is valid for example.com.
	e := startProxy(t, []string{fmt.Sprintf("example.com:%d", port)}, nil,
		map[string][]netip.Addr{"example.com": loopback()})
	pool := x509.NewCertPool()
	pool.AddCert(origin.Certificate())
	c := httpClient(t, "http://"+e.addr, &tls.Config{RootCAs: pool})
	u := fmt.Sprintf("https://example.com:%d/", port)
	code, body := get(t, c, u)
	if code != 200 || body != fmt.Sprintf("secure hello from example.com:%d", port) {
		t.Errorf("GET %s = %d %q", u, code, body)
	}
	if v := e.Violations(); len(v) != 0 {
		t.Errorf("violations = %+v, want none", v)
	}
	want := fmt.Sprintf("127.0.0.1:%d", port)
	if d := e.Dialed(); len(d) != 1 || d[0] != want {
		t.Errorf("dialed %q, want [%q] (the checked address, not the name)", d, want)
	}
}

func TestConnectTunnelBothWaysWithHalfClose(t *testing.T) {
	echo := startEcho(t, "tcp", "127.0.0.1:0")
	port := portOf(t, echo.Addr().String())
	e := startProxy(t, []string{fmt.Sprintf("echo.test:%d", port)}, nil,
		map[string][]netip.Addr{"echo.test": loopback()})
	c := dialProxy(t, e)
	// Bytes sent right behind the CONNECT must reach the origin too.
	fmt.Fprintf(c, "CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test:%d\r\n\r\nearly,", port, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %v, %v; want 200", resp, err)
	}
	if _, err := io.WriteString(c, "late"); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "early,late" {
		t.Errorf("tunnel echoed %q, %v; want %q then EOF", got, err, "early,late")
	}
}

func TestForwardStreamsResponse(t *testing.T) {
	release := make(chan struct{})
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(ioTimeout):
		}
		io.WriteString(w, "second\n")
	}))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil,
		map[string][]netip.Addr{"origin.test": loopback()})
	c := httpClient(t, "http://"+e.addr, nil)
	resp, err := c.Get(fmt.Sprintf("http://origin.test:%d/stream", port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// The first chunk arrives while the origin still holds the second.
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first line = %q, %v", line, err)
	}
	close(release)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "second\n" {
		t.Errorf("rest = %q, %v; want %q", rest, err, "second\n")
	}
}

func TestForwardHeadersAndBody(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/headers":
			fmt.Fprintf(w, "host=%s uri=%s pa=%q pc=%q hop=%q keep=%q ua=%q",
				r.Host, r.RequestURI, r.Header.Get("Proxy-Authorization"), r.Header.Get("Proxy-Connection"),
				r.Header.Get("X-Hop"), r.Header.Get("X-Keep"), r.Header.Get("User-Agent"))
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			w.Header().Set("Trailer", "X-Resp-Sum")
			fmt.Fprintf(w, "%s %q te=%q trailer=%q", r.Method, b, r.TransferEncoding, r.Trailer.Get("X-Sum"))
			w.Header().Set("X-Resp-Sum", "7")
		case "/raw":
			conn, bufrw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			bufrw.WriteString("HTTP/1.1 200 OK\r\nConnection: X-Resp-Hop\r\nX-Resp-Hop: 1\r\nKeep-Alive: timeout=5\r\n" +
				"Proxy-Authenticate: Basic\r\nUpgrade: h2c\r\nX-Origin: yes\r\nContent-Length: 2\r\n\r\nok")
			bufrw.Flush()
		case "/chunked":
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			io.WriteString(w, "b")
		}
	}))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil,
		map[string][]netip.Addr{"origin.test": loopback()})

	t.Run("hop-by-hop headers", func(t *testing.T) {
		resp, body := rawHTTP(t, e, fmt.Sprintf("GET http://origin.test:%d/headers?q=1 HTTP/1.1\r\n"+
			"Host: elsewhere.test\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\n"+
			"Connection: X-Hop, close\r\nX-Hop: secret\r\nX-Keep: kept\r\n\r\n", port))
		want := fmt.Sprintf(`host=origin.test:%d uri=/headers?q=1 pa="" pc="" hop="" keep="kept" ua=""`, port)
		if resp.StatusCode != 200 || body != want {
			t.Errorf("origin saw %d %q, want %q", resp.StatusCode, body, want)
		}
	})

	t.Run("hop-by-hop response headers", func(t *testing.T) {
		resp, body := rawHTTP(t, e, fmt.Sprintf("GET http://origin.test:%d/raw HTTP/1.1\r\nHost: origin.test\r\n\r\n", port))
		if resp.StatusCode != 200 || body != "ok" || resp.Header.Get("X-Origin") != "yes" {
			t.Fatalf("got %d %q %v", resp.StatusCode, body, resp.Header)
		}
		for _, h := range []string{"X-Resp-Hop", "Keep-Alive", "Proxy-Authenticate", "Upgrade"} {
			if v := resp.Header.Get(h); v != "" {
				t.Errorf("response header %s = %q, want it removed", h, v)
			}
		}
	})

	t.Run("chunked request body with trailer", func(t *testing.T) {
		resp, body := rawHTTP(t, e, fmt.Sprintf("POST http://origin.test:%d/echo HTTP/1.1\r\nHost: origin.test\r\n"+
			"Transfer-Encoding: chunked\r\nTrailer: X-Sum\r\nTE: trailers\r\n\r\n"+
			"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 42\r\n\r\n", port))
		want := `POST "hello world" te=["chunked"] trailer="42"`
		if resp.StatusCode != 200 || body != want {
			t.Errorf("echo = %d %q, want %q", resp.StatusCode, body, want)
		}
		if got := resp.Trailer.Get("X-Resp-Sum"); got != "7" {
			t.Errorf("response trailer X-Resp-Sum = %q, want %q", got, "7")
		}
	})

	t.Run("content-length body, one request per connection", func(t *testing.T) {
		// The proxy serves one request per client connection: the response
		// says Connection: close and the connection ends after it, even when
		// the client asked to keep it or sent a second request behind the
		// first.
		for i, connHdr := range []string{"", "Connection: keep-alive\r\n", "Connection: close\r\n"} {
			c := dialProxy(t, e)
			br := bufio.NewReader(c)
			body := "body " + strconv.Itoa(i)
			req := fmt.Sprintf("PUT http://origin.test:%d/echo HTTP/1.1\r\nHost: origin.test\r\n%sContent-Length: %d\r\n\r\n%s",
				port, connHdr, len(body), body)
			io.WriteString(c, req+req)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			b, err := io.ReadAll(resp.Body)
			if want := fmt.Sprintf(`PUT %q te=[] trailer=""`, body); err != nil || string(b) != want {
				t.Errorf("request %d: %q, %v; want %q", i, b, err, want)
			}
			if !resp.Close {
				t.Errorf("request %d: response Close = false, want true", i)
			}
			if n, err := br.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("request %d: after the response, read %d, %v; want EOF", i, n, err)
			}
		}
	})

	t.Run("HTTP/1.0 client gets an unchunked body", func(t *testing.T) {
		c := dialProxy(t, e)
		fmt.Fprintf(c, "GET http://origin.test:%d/chunked HTTP/1.0\r\n\r\n", port)
		raw, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		head, body, _ := strings.Cut(string(raw), "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 200") || strings.Contains(strings.ToLower(head), "chunked") || body != "ab" {
			t.Errorf("HTTP/1.0 response = %q, want 200, no chunking, body %q", raw, "ab")
		}
	})
}

func TestPublicAddressNeedsNoEntry(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "public") }))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	e := startProxy(t, nil, nil, map[string][]netip.Addr{"public.test": {netip.MustParseAddr("192.31.196.7")}})
	code, body := get(t, httpClient(t, "http://"+e.addr, nil), fmt.Sprintf("http://public.test:%d/", port))
	if code != 200 || body != "public" {
		t.Errorf("GET public.test = %d %q, want 200 %q", code, body, "public")
	}
	if d, want := e.Dialed(), fmt.Sprintf("192.31.196.7:%d", port); len(d) != 1 || d[0] != want {
		t.Errorf("dialed %q, want [%q]", d, want)
	}
}

func TestDeniedName(t *testing.T) {
	e := startProxy(t, nil, []string{"*.blocked.test"}, map[string][]netip.Addr{"x.blocked.test": {netip.MustParseAddr("192.31.196.9")}})
	for _, tt := range []struct {
		name, proto, payload string
		port                 int
	}{
		{"GET", "http", "GET http://x.blocked.test/page HTTP/1.1\r\nHost: x.blocked.test\r\n\r\n", 80},
		{"CONNECT", "connect", "CONNECT x.blocked.test:443 HTTP/1.1\r\nHost: x.blocked.test:443\r\n\r\n", 443},
		// The refused request's body is drained, so the client reads the 403
		// rather than a reset.
		{"POST with a body", "http", "POST http://x.blocked.test/upload HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("z", 100000), 80},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(e.Violations())
			resp, body := rawHTTP(t, e, tt.payload)
			reason := fmt.Sprintf(`x.blocked.test:%d is denied by deniedDomains entry "*.blocked.test"`, tt.port)
			if resp.StatusCode != 403 || resp.Header.Get("X-Agentconnect-Policy") != reason || body != reason+"\n" {
				t.Errorf("got %d, X-Agentconnect-Policy %q, body %q; want 403 with reason %q", resp.StatusCode,
					resp.Header.Get("X-Agentconnect-Policy"), body, reason)
			}
			v := e.Violations()[before:]
			if len(v) != 1 || v[0].Protocol != tt.proto || v[0].Host != "x.blocked.test" || v[0].Port != tt.port ||
				v[0].Addr != "" || v[0].Reason != reason || v[0].Time.IsZero() {
				t.Errorf("violations = %+v, want one %s violation with the reason", v, tt.proto)
			}
		})
	}
	if n := e.resolver.lookups.Load(); n != 0 {
		t.Errorf("resolver called %d times for denied names, want 0", n)
	}
}

func TestNameResolvingToLoopback(t *testing.T) {
	var hits atomic.Int64
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	records := map[string][]netip.Addr{
		"sneaky.test": loopback(),
		"mixed.test":  {netip.MustParseAddr("192.31.196.7"), netip.MustParseAddr("127.0.0.1")},
		"mapped.test": {netip.MustParseAddr("::ffff:127.0.0.1")},
	}
	tests := []struct {
		name    string
		allowed []string
		host    string
	}{
		{"no entry", nil, "sneaky.test"},
		{"name without port", []string{"sneaky.test"}, "sneaky.test"},
		{"entry on another port", []string{"sneaky.test", fmt.Sprintf("sneaky.test:%d", port+1)}, "sneaky.test"},
		{"wildcard", []string{fmt.Sprintf("*.test:%d", port)}, "sneaky.test"},
		{"partly public", nil, "mixed.test"},
		{"IPv4-mapped", nil, "mapped.test"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startProxy(t, tt.allowed, nil, records)
			resp, body := rawHTTP(t, e, fmt.Sprintf("GET http://%s:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", tt.host, port))
			if resp.StatusCode != 403 || !strings.Contains(body, "loopback") || !strings.Contains(body, "127.0.0.1") {
				t.Errorf("got %d %q, want 403 naming the loopback address", resp.StatusCode, body)
			}
			v := e.Violations()
			if len(v) != 1 || v[0].Protocol != "http" || v[0].Host != tt.host || !strings.HasSuffix(v[0].Addr, "127.0.0.1") ||
				!strings.Contains(v[0].Reason, fmt.Sprintf("add %q", fmt.Sprintf("%s:%d", tt.host, port))) {
				t.Errorf("violations = %+v, want one naming the address and the entry to add", v)
			}
			if len(e.Dialed()) != 0 {
				t.Errorf("dialed %q, want nothing", e.Dialed())
			}
		})
	}
	if hits.Load() != 0 {
		t.Errorf("origin reached %d times, want 0", hits.Load())
	}

	t.Run("explicit entry opens that port", func(t *testing.T) {
		e := startProxy(t, []string{fmt.Sprintf("sneaky.test:%d", port)}, nil, records)
		code, _ := get(t, httpClient(t, "http://"+e.addr, nil), fmt.Sprintf("http://sneaky.test:%d/", port))
		if code != 200 || hits.Load() != 1 {
			t.Errorf("GET = %d, origin hits %d; want 200, 1", code, hits.Load())
		}
	})
}

func TestIPLiteral(t *testing.T) {
	echo := startEcho(t, "tcp", "127.0.0.1:0")
	port := portOf(t, echo.Addr().String())
	connect := fmt.Sprintf("CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", port)

	e := startProxy(t, []string{fmt.Sprintf("127.0.0.1:%d", port)}, nil, nil)
	if resp, _ := rawHTTP(t, e, connect); resp.StatusCode != 200 {
		t.Errorf("CONNECT with an entry = %d, want 200", resp.StatusCode)
	}
	e = startProxy(t, nil, nil, nil)
	resp, body := rawHTTP(t, e, connect)
	if v := e.Violations(); resp.StatusCode != 403 || len(v) != 1 || v[0].Addr != "127.0.0.1" || v[0].Protocol != "connect" {
		t.Errorf("CONNECT without an entry = %d %q, violations %+v; want 403 and one violation at 127.0.0.1", resp.StatusCode, body, v)
	}
	if n := e.resolver.lookups.Load(); n != 0 {
		t.Errorf("resolver called %d times for an IP literal, want 0", n)
	}
}

// TestHostName: host.agentconnect.internal is the host's loopback, as in
// microsandbox: opened per port by a 127.0.0.1 entry or one naming it,
// dialled at 127.0.0.1, resolved by nobody.
func TestHostName(t *testing.T) {
	echo := startEcho(t, "tcp", "127.0.0.1:0")
	port := portOf(t, echo.Addr().String())
	connect := fmt.Sprintf("CONNECT host.agentconnect.internal:%d HTTP/1.1\r\nHost: host.agentconnect.internal\r\n\r\n", port)
	for _, entry := range []string{fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("host.agentconnect.internal:%d", port)} {
		e := startProxy(t, []string{entry}, nil, nil)
		if resp, _ := rawHTTP(t, e, connect); resp.StatusCode != 200 {
			t.Errorf("entry %s: CONNECT host.agentconnect.internal = %d, want 200", entry, resp.StatusCode)
		}
		if d := e.Dialed(); len(d) != 1 || d[0] != fmt.Sprintf("127.0.0.1:%d", port) {
			t.Errorf("entry %s: dialled %v, want 127.0.0.1:%d", entry, d, port)
		}
		if n := e.resolver.lookups.Load(); n != 0 {
			t.Errorf("entry %s: %d lookups, want none", entry, n)
		}
	}
	for _, allowed := range [][]string{nil, {fmt.Sprintf("127.0.0.1:%d", port+1)}} {
		e := startProxy(t, allowed, nil, nil)
		if resp, body := rawHTTP(t, e, connect); resp.StatusCode != 403 || len(e.Dialed()) != 0 {
			t.Errorf("allowed %v: CONNECT host.agentconnect.internal = %d %q, dialled %v; want 403 and nothing dialled", allowed, resp.StatusCode, body, e.Dialed())
		}
	}
}

func TestOriginFailures(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, closed.Addr().String())
	closed.Close()
	e := startProxy(t, []string{fmt.Sprintf("down.test:%d", port), "missing.test"}, nil,
		map[string][]netip.Addr{"down.test": loopback()})
	for _, tt := range []struct{ payload, want string }{
		{fmt.Sprintf("GET http://down.test:%d/ HTTP/1.1\r\nHost: x\r\n\r\n", port), "connection refused"},
		{fmt.Sprintf("CONNECT down.test:%d HTTP/1.1\r\n\r\n", port), "connection refused"},
		{"GET http://missing.test/ HTTP/1.1\r\nHost: x\r\n\r\n", "resolve missing.test"},
	} {
		resp, body := rawHTTP(t, e, tt.payload)
		if resp.StatusCode != 502 || !strings.Contains(body, tt.want) {
			t.Errorf("%q = %d %q, want 502 mentioning %q", firstLine(tt.payload), resp.StatusCode, body, tt.want)
		}
	}
	if v := e.Violations(); len(v) != 0 {
		t.Errorf("violations = %+v, want none for unreachable allowed origins", v)
	}
}

// socksHandshake negotiates no-auth and sends a request; it returns the reply
// code and bound address, or fails the test.
func socksRequest(t *testing.T, c net.Conn, br *bufio.Reader, cmd byte, addr []byte, port int) (code byte, bound netip.AddrPort) {
	t.Helper()
	if _, err := c.Write([]byte{5, 1, 0}); err != nil {
		t.Fatal(err)
	}
	var m [2]byte
	if _, err := io.ReadFull(br, m[:]); err != nil || m != [2]byte{5, 0} {
		t.Fatalf("method reply = %v, %v; want [5 0]", m, err)
	}
	req := append([]byte{5, cmd, 0}, addr...)
	req = binary.BigEndian.AppendUint16(req, uint16(port))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var h [4]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatalf("read reply: %v", err)
	}
	if h[0] != 5 || h[2] != 0 {
		t.Fatalf("reply header = %v", h)
	}
	var ip netip.Addr
	switch h[3] {
	case 1:
		var b [4]byte
		io.ReadFull(br, b[:])
		ip = netip.AddrFrom4(b)
	case 4:
		var b [16]byte
		io.ReadFull(br, b[:])
		ip = netip.AddrFrom16(b)
	default:
		t.Fatalf("reply address type %d", h[3])
	}
	var p [2]byte
	if _, err := io.ReadFull(br, p[:]); err != nil {
		t.Fatal(err)
	}
	return h[1], netip.AddrPortFrom(ip, binary.BigEndian.Uint16(p[:]))
}

func domain(name string) []byte { return append([]byte{3, byte(len(name))}, name...) }

func ipv4(s string) []byte { return append([]byte{1}, netip.MustParseAddr(s).AsSlice()...) }

func ipv6(s string) []byte { return append([]byte{4}, netip.MustParseAddr(s).AsSlice()...) }

func TestSOCKS5(t *testing.T) {
	echo := startEcho(t, "tcp", "127.0.0.1:0")
	port := portOf(t, echo.Addr().String())
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := portOf(t, closed.Addr().String())
	closed.Close()
	records := map[string][]netip.Addr{
		"echo.test":      loopback(),
		"sneaky.test":    loopback(),
		"down.test":      loopback(),
		"x.blocked.test": {netip.MustParseAddr("192.31.196.9")},
	}
	e := startProxy(t, []string{
		fmt.Sprintf("echo.test:%d", port), fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("[::1]:%d", port),
		fmt.Sprintf("down.test:%d", closedPort), "missing.test", "*.blocked.test",
	}, []string{"*.blocked.test"}, records)
	// open has no allowlist, so names pass the first check and the address
	// check decides.
	open := startProxy(t, nil, []string{"*.blocked.test"}, records)

	tunnels := []struct {
		name string
		addr []byte
	}{
		{"domain", domain("echo.test")},
		{"IPv4", ipv4("127.0.0.1")},
		{"IP literal as domain", domain("127.0.0.1")},
	}
	for _, tt := range tunnels {
		t.Run(tt.name, func(t *testing.T) {
			c := dialProxy(t, e)
			br := bufio.NewReader(c)
			code, bound := socksRequest(t, c, br, 1, tt.addr, port)
			if code != 0 || !bound.Addr().IsLoopback() || bound.Port() == 0 {
				t.Fatalf("reply = %#x bound %v, want 0x00 and a loopback bound address", code, bound)
			}
			io.WriteString(c, "ping "+tt.name)
			c.CloseWrite()
			got, err := io.ReadAll(br)
			if err != nil || string(got) != "ping "+tt.name {
				t.Errorf("tunnel echoed %q, %v", got, err)
			}
		})
	}

	failures := []struct {
		name   string
		env    *env
		cmd    byte
		addr   []byte
		port   int
		code   byte
		violAt string // the violation's Addr, "-" when none is expected
	}{
		{"denied name", open, 1, domain("x.blocked.test"), 443, 0x02, ""},
		{"not in allowlist", e, 1, domain("other.test"), 443, 0x02, ""},
		{"name to loopback", open, 1, domain("sneaky.test"), port, 0x02, "127.0.0.1"},
		{"IPv4 without entry", open, 1, ipv4("127.0.0.1"), port, 0x02, "127.0.0.1"},
		{"IPv6 without entry", open, 1, ipv6("::1"), port, 0x02, "::1"},
		{"metadata", open, 1, ipv4("169.254.169.254"), 80, 0x02, "169.254.169.254"},
		{"BIND", e, 2, domain("echo.test"), port, 0x07, "-"},
		{"UDP ASSOCIATE", e, 3, ipv4("127.0.0.1"), port, 0x07, "-"},
		{"connection refused", e, 1, domain("down.test"), closedPort, 0x05, "-"},
		{"no such host", e, 1, domain("missing.test"), 80, 0x04, "-"},
	}
	for _, tt := range failures {
		t.Run(tt.name, func(t *testing.T) {
			e := tt.env
			before := len(e.Violations())
			c := dialProxy(t, e)
			br := bufio.NewReader(c)
			code, _ := socksRequest(t, c, br, tt.cmd, tt.addr, tt.port)
			if code != tt.code {
				t.Errorf("reply = %#x, want %#x", code, tt.code)
			}
			if n, err := br.Read(make([]byte, 1)); err == nil {
				t.Errorf("read %d bytes after a failure reply, want the connection closed", n)
			}
			v := e.Violations()[before:]
			if tt.violAt == "-" {
				if len(v) != 0 {
					t.Errorf("violations = %+v, want none", v)
				}
				return
			}
			if len(v) != 1 || v[0].Protocol != "socks5" || v[0].Addr != tt.violAt || v[0].Reason == "" {
				t.Errorf("violations = %+v, want one socks5 violation at %q", v, tt.violAt)
			}
		})
	}

	t.Run("IPv6", func(t *testing.T) {
		echo6, err := net.Listen("tcp", fmt.Sprintf("[::1]:%d", port))
		if err != nil {
			t.Skipf("no IPv6 loopback on port %d: %v", port, err)
		}
		echo6.Close()
		startEcho(t, "tcp", fmt.Sprintf("[::1]:%d", port))
		c := dialProxy(t, e)
		br := bufio.NewReader(c)
		if code, _ := socksRequest(t, c, br, 1, ipv6("::1"), port); code != 0 {
			t.Fatalf("reply = %#x, want 0", code)
		}
		io.WriteString(c, "six")
		c.CloseWrite()
		if got, err := io.ReadAll(br); err != nil || string(got) != "six" {
			t.Errorf("tunnel echoed %q, %v", got, err)
		}
	})

	t.Run("no acceptable method", func(t *testing.T) {
		c := dialProxy(t, e)
		c.Write([]byte{5, 1, 2}) // username/password only
		got, _ := io.ReadAll(c)
		if string(got) != "\x05\xff" {
			t.Errorf("reply = %v, want [5 255] then close", []byte(got))
		}
	})

	t.Run("unknown address type", func(t *testing.T) {
		c := dialProxy(t, e)
		c.Write([]byte{5, 1, 0, 5, 1, 0, 9, 1, 2, 3, 4})
		got, _ := io.ReadAll(c)
		if len(got) < 4 || got[2] != 5 || got[3] != 0x08 {
			t.Errorf("reply = %v, want method [5 0] then reply code 0x08", got)
		}
	})
}

func TestSOCKS5WithHTTPClient(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "via socks") }))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
	code, body := get(t, httpClient(t, "socks5://"+e.addr, nil), fmt.Sprintf("http://origin.test:%d/", port))
	if code != 200 || body != "via socks" {
		t.Errorf("GET via socks5 = %d %q", code, body)
	}
	if n := e.resolver.lookups.Load(); n != 1 {
		t.Errorf("proxy resolved %d times, want 1 (the client sends the name)", n)
	}
}

func TestMalformedInputKeepsServing(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "still here") }))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})

	huge := "GET http://origin.test/ HTTP/1.1\r\nX-Big: " + strings.Repeat("a", 100<<10) + "\r\n\r\n"
	inputs := []struct {
		name, payload, wantPrefix string
	}{
		{"garbage", "garbage\r\n\r\n", "HTTP/1.1 400"},
		{"binary", "\x00\x01\x02\xff\r\n\r\n", "HTTP/1.1 400"},
		{"origin-form", "GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n", "HTTP/1.1 400"},
		{"ftp scheme", "GET ftp://origin.test/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"CONNECT without port", "CONNECT origin.test HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"CONNECT bad port", "CONNECT origin.test:99999 HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"URL bad port", "GET http://origin.test:0/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"bad header", "GET http://origin.test/ HTTP/1.1\r\nno colon here\r\n\r\n", "HTTP/1.1 400"},
		{"huge headers", huge, "HTTP/1.1 431"},
		{"huge request line", "GET http://origin.test/" + strings.Repeat("a", 100<<10) + " HTTP/1.1\r\n\r\n", "HTTP/1.1 431"},
		{"unsupported version", "GET http://origin.test/ HTTP/2.0\r\n\r\n", "HTTP/1.1 400"},
		{"no version", "GET http://origin.test/\r\n\r\n", "HTTP/1.1 400"},
		{"folded header", "GET http://origin.test/ HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n", "HTTP/1.1 400"},
		{"space before colon", "GET http://origin.test/ HTTP/1.1\r\nX-A : 1\r\n\r\n", "HTTP/1.1 400"},
		{"control character in header", "GET http://origin.test/ HTTP/1.1\r\nX-A: a\x01b\r\n\r\n", "HTTP/1.1 400"},
		{"Content-Length and Transfer-Encoding", "POST http://origin.test/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.1 400"},
		{"unsupported Transfer-Encoding", "POST http://origin.test/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 400"},
		{"conflicting Content-Length", "POST http://origin.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "HTTP/1.1 400"},
		{"negative Content-Length", "POST http://origin.test/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400"},
		{"truncated request", "GET http://origin.te", ""},
		{"SOCKS5 version byte only", "\x05", ""},
		{"SOCKS5 zero methods", "\x05\x00", "\x05\xff"},
		{"SOCKS5 wrong request version", "\x05\x01\x00\x04\x01\x00\x01\x7f\x00\x00\x01\x00\x50", "\x05\x00"},
		{"SOCKS5 truncated domain", "\x05\x01\x00\x05\x01\x00\x03\x20abc", "\x05\x00"},
		{"SOCKS5 empty domain", "\x05\x01\x00\x05\x01\x00\x03\x00\x00\x50", "\x05\x00\x05\x02"},
		{"SOCKS5 port 0", "\x05\x01\x00\x05\x01\x00\x03\x0borigin.test\x00\x00", "\x05\x00\x05\x01"},
	}
	for _, tt := range inputs {
		t.Run(tt.name, func(t *testing.T) {
			c := dialProxy(t, e)
			io.WriteString(c, tt.payload)
			c.CloseWrite()
			got, _ := io.ReadAll(c)
			if !strings.HasPrefix(string(got), tt.wantPrefix) {
				t.Errorf("reply = %q, want it to start with %q", got, tt.wantPrefix)
			}
		})
	}
	code, body := get(t, httpClient(t, "http://"+e.addr, nil), fmt.Sprintf("http://origin.test:%d/", port))
	if code != 200 || body != "still here" {
		t.Errorf("after malformed input, GET = %d %q", code, body)
	}
}

func TestSlowClientsDoNotBlockOthers(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fast") }))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	const handshake = time.Second
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()},
		func(s *proxy.Server) { s.HandshakeTimeout = handshake })

	silent := dialProxy(t, e) // connects, sends nothing
	partial := dialProxy(t, e)
	io.WriteString(partial, "GET http://origin.te") // half a request line
	socks := dialProxy(t, e)
	socks.Write([]byte{5, 3, 0}) // half a SOCKS5 greeting

	c := httpClient(t, "http://"+e.addr, nil)
	start := time.Now()
	for range 5 {
		if code, body := get(t, c, fmt.Sprintf("http://origin.test:%d/", port)); code != 200 || body != "fast" {
			t.Fatalf("GET = %d %q", code, body)
		}
	}
	if d := time.Since(start); d > handshake {
		t.Errorf("5 requests took %v while slow clients were connected, want < %v", d, handshake)
	}
	// The stalled clients are dropped after the handshake timeout.
	for name, sc := range map[string]net.Conn{"silent": silent, "partial": partial, "socks": socks} {
		sc.SetReadDeadline(time.Now().Add(ioTimeout))
		start := time.Now()
		if _, err := io.ReadAll(sc); err != nil {
			t.Errorf("%s: %v, want the proxy to close it", name, err)
		}
		if d := time.Since(start); d > 5*handshake {
			t.Errorf("%s closed after %v, want about %v", name, d, handshake)
		}
	}
}

// serveOwnListener serves a proxy that opens 127.0.0.1:port on a listener
// of its own, and returns a client connection to it and stopServe, which
// closes the listener and checks that Serve returns nil.
func serveOwnListener(t *testing.T, port int) (c net.Conn, stopServe func()) {
	t.Helper()
	p, err := netpolicy.New([]string{fmt.Sprintf("127.0.0.1:%d", port)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := &proxy.Server{Policy: p, Logf: t.Logf}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	c, err = net.DialTimeout("tcp", l.Addr().String(), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(ioTimeout))
	return c, func() {
		t.Helper()
		l.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve = %v, want nil", err)
			}
		case <-time.After(ioTimeout):
			t.Fatal("Serve did not return after the listener closed")
		}
	}
}

func TestServeClosesTunnels(t *testing.T) {
	echo := startEcho(t, "tcp", "127.0.0.1:0")
	port := portOf(t, echo.Addr().String())
	c, stopServe := serveOwnListener(t, port)
	fmt.Fprintf(c, "CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", port)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %v, %v", resp, err)
	}
	io.WriteString(c, "x")
	if _, err := io.ReadFull(br, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}

	stopServe()
	if n, err := br.Read(make([]byte, 1)); err == nil {
		t.Errorf("tunnel read %d bytes after Serve returned, want it closed", n)
	}
}
