package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
	"github.com/agentconnect-md/agentconnect/internal/testdns"
	"github.com/agentconnect-md/agentconnect/strategy/srt/proxy"
)

// TestSandboxLayout runs the srt layout end to end: the proxy serves two
// TCP listeners (the sandbox's HTTP and SOCKS5 ports, which sandbox-exec
// hands to the shim), resolves through a real DNS exchange (testdns) and
// dials with its default dialer.
func TestSandboxLayout(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello "+r.Host)
	}))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	echo := startEcho(t, "tcp", "127.0.0.1:0")
	echoPort := portOf(t, echo.Addr().String())
	dns := testdns.Start(t, map[string][]netip.Addr{
		"origin.test": {netip.MustParseAddr("127.0.0.1")},
		"echo.test":   {netip.MustParseAddr("127.0.0.1")},
	})

	p, err := netpolicy.New([]string{fmt.Sprintf("origin.test:%d", port), fmt.Sprintf("echo.test:%d", echoPort)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var violations []netpolicy.Violation // guarded by mu
	srv := &proxy.Server{
		Policy:   p,
		Resolver: &net.Resolver{PreferGo: true, Dial: testdns.Dialer(dns)},
		OnViolation: func(v netpolicy.Violation) {
			mu.Lock()
			violations = append(violations, v)
			mu.Unlock()
		},
		Logf: t.Logf,
	}
	var ports []string
	for i := 0; i < 2; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serveUntilCleanup(t, srv, l)
		ports = append(ports, l.Addr().String())
	}
	httpPort, socksPort := ports[0], ports[1]

	u := fmt.Sprintf("http://origin.test:%d/", port)
	for _, proxyURL := range []string{"http://" + httpPort, "socks5://" + socksPort} {
		code, body := get(t, httpClient(t, proxyURL, nil), u)
		if want := fmt.Sprintf("hello origin.test:%d", port); code != 200 || body != want {
			t.Errorf("GET %s via %s = %d %q, want 200 %q", u, proxyURL, code, body, want)
		}
	}

	// A CONNECT tunnel keeps half-close semantics.
	c, err := net.DialTimeout("tcp", httpPort, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(ioTimeout))
	fmt.Fprintf(c, "CONNECT echo.test:%d HTTP/1.1\r\n\r\n", echoPort)
	br := bufio.NewReader(c)
	if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT = %v, %v", resp, err)
	}
	io.WriteString(c, "through the tunnel")
	c.(*net.TCPConn).CloseWrite()
	if got, err := io.ReadAll(br); err != nil || string(got) != "through the tunnel" {
		t.Errorf("tunnel echoed %q, %v", got, err)
	}

	// A refusal is a 403 and a violation.
	code, body := get(t, httpClient(t, "http://"+httpPort, nil), "http://elsewhere.test/")
	mu.Lock()
	defer mu.Unlock()
	if code != 403 || len(violations) != 1 || violations[0].Host != "elsewhere.test" {
		t.Errorf("GET elsewhere.test = %d %q, violations %+v; want 403 and one violation", code, body, violations)
	}
}
