package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// startRawOrigin serves TCP on 127.0.0.1 with handle, one call per
// connection, until the test ends; it returns the port.
func startRawOrigin(t *testing.T, handle func(c net.Conn)) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
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
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	return portOf(t, l.Addr().String())
}

// readHead reads up to and including the blank line that ends a head.
func readHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil || line == "\r\n" {
			return b.String(), err
		}
	}
}

// TestForwardExactBytes checks what the origin receives and what the client
// gets back, byte for byte: the request line in origin-form, Host from the
// URL, hop-by-hop headers dropped (framing headers even when Connection names
// them), Connection: close, the body with its framing as sent; and the
// response with informational responses passed on and hop-by-hop headers
// dropped.
func TestForwardExactBytes(t *testing.T) {
	const response = "HTTP/1.1 100 Continue\r\nX-Info: 1\r\nConnection: keep-alive\r\n\r\n" +
		"HTTP/1.1 201 Created\r\nConnection: X-R, Keep-Alive\r\nX-R: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\n" +
		"Upgrade: h2c\r\nx-lower: kept\r\nContent-Length: 2\r\n\r\nok"
	const wantResponse = "HTTP/1.1 100 Continue\r\nX-Info: 1\r\n\r\n" +
		"HTTP/1.1 201 Created\r\nx-lower: kept\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
	tests := []struct {
		name, request, want string // want: what the origin reads; %[1]d is its port
	}{
		{
			"chunked body with extensions and trailers",
			"POST http://origin.test:%[1]d/p/a%%20th?q=1&r HTTP/1.1\r\nHost: elsewhere.test\r\n" +
				"Connection: keep-alive, X-Hop, Transfer-Encoding, Host\r\nX-Hop: 1\r\nX-Keep: a\r\nTransfer-Encoding: chunked\r\n" +
				"Trailer: X-Sum\r\nTE: trailers\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n" +
				"Keep-Alive: 5\r\nUpgrade: h2c\r\n\r\n" +
				"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Sum: 13\r\n\r\n",
			"POST /p/a%%20th?q=1&r HTTP/1.1\r\nHost: origin.test:%[1]d\r\nX-Keep: a\r\nTransfer-Encoding: chunked\r\n" +
				"Trailer: X-Sum\r\nConnection: close\r\n\r\n" +
				"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Sum: 13\r\n\r\n",
		},
		{
			"content-length body named in Connection",
			"PUT http://origin.test:%[1]d HTTP/1.1\r\nConnection: Content-Length\r\nContent-Length: 3\r\nUser-Agent: test\r\n\r\nabc",
			"PUT / HTTP/1.1\r\nHost: origin.test:%[1]d\r\nContent-Length: 3\r\nUser-Agent: test\r\nConnection: close\r\n\r\nabc",
		},
		{
			"query without path",
			"GET http://origin.test:%[1]d?x=1 HTTP/1.1\r\n\r\n",
			"GET /?x=1 HTTP/1.1\r\nHost: origin.test:%[1]d\r\nConnection: close\r\n\r\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan string, 1)
			port := startRawOrigin(t, func(c net.Conn) {
				want := fmt.Sprintf(tt.want, c.LocalAddr().(*net.TCPAddr).Port)
				b := make([]byte, len(want))
				n, _ := io.ReadFull(c, b)
				got <- string(b[:n])
				io.WriteString(c, response)
			})
			e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
			c := dialProxy(t, e)
			fmt.Fprintf(c, tt.request, port)
			resp, err := io.ReadAll(c)
			if err != nil {
				t.Fatal(err)
			}
			if g, want := <-got, fmt.Sprintf(tt.want, port); g != want {
				t.Errorf("origin read\n%q\nwant\n%q", g, want)
			}
			if string(resp) != wantResponse {
				t.Errorf("client read\n%q\nwant\n%q", resp, wantResponse)
			}
		})
	}
}

// TestForwardResponseFraming checks that the proxy ends the exchange where
// the response ends, also when the origin keeps its connection open despite
// Connection: close, and that it reports broken responses as 502.
func TestForwardResponseFraming(t *testing.T) {
	tests := []struct {
		name, method, response string
		wantStatus             int
		wantBody               string
	}{
		{"content-length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 200, "ok"},
		{"chunked", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 200, "ok"},
		{"HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", 200, ""},
		{"204", "GET", "HTTP/1.1 204 No Content\r\n\r\n", 204, ""},
		{"304", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", 304, ""},
		{"garbage", "GET", "garbage\r\n\r\n", 502, ""},
		{"bad content-length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", 502, ""},
		{"switching protocols", "GET", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", 502, ""},
		{"too many informational", "GET", strings.Repeat("HTTP/1.1 103 Early Hints\r\n\r\n", 20), 502, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			port := startRawOrigin(t, func(c net.Conn) {
				br := bufio.NewReader(c)
				if _, err := readHead(br); err != nil {
					return
				}
				io.WriteString(c, tt.response)
				io.Copy(io.Discard, br) // keep the connection until the proxy closes it
			})
			e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
			c := dialProxy(t, e)
			fmt.Fprintf(c, "%s http://origin.test:%d/ HTTP/1.1\r\n\r\n", tt.method, port)
			start := time.Now()
			br := bufio.NewReader(c)
			var resp *http.Response
			for i := 0; resp == nil || resp.StatusCode < 200; i++ { // informational responses come through
				var err error
				if resp, err = http.ReadResponse(br, &http.Request{Method: tt.method}); err != nil {
					t.Fatalf("response %d: %v", i, err)
				}
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("read body: %v", err)
			}
			if resp.StatusCode != tt.wantStatus || tt.wantStatus != 502 && string(body) != tt.wantBody {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if !resp.Close {
				t.Errorf("response without Connection: close")
			}
			if n, err := br.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("after the response, read %d, %v; want EOF", n, err)
			}
			if d := time.Since(start); d > ioTimeout/2 {
				t.Errorf("exchange took %v: the proxy waited for the origin to close", d)
			}
		})
	}

	t.Run("close-delimited", func(t *testing.T) {
		port := startRawOrigin(t, func(c net.Conn) {
			if _, err := readHead(bufio.NewReader(c)); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close")
		})
		e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
		resp, body := rawHTTP(t, e, fmt.Sprintf("GET http://origin.test:%d/ HTTP/1.1\r\n\r\n", port))
		if resp.StatusCode != 200 || body != "until close" || resp.Proto != "HTTP/1.1" {
			t.Errorf("got %s %d %q, want HTTP/1.1 200 %q", resp.Proto, resp.StatusCode, body, "until close")
		}
	})
}

// TestForwardExpectContinue checks that a client waiting for 100 Continue
// gets it from the origin, and that its body then reaches the origin.
func TestForwardExpectContinue(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %q", b)
	}))
	defer origin.Close()
	port := portOf(t, origin.Listener.Addr().String())
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
	c := dialProxy(t, e)
	fmt.Fprintf(c, "POST http://origin.test:%d/ HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n", port)
	br := bufio.NewReader(c)
	head, err := readHead(br)
	if err != nil || !strings.HasPrefix(head, "HTTP/1.1 100 ") {
		t.Fatalf("first reply %q, %v; want 100 Continue", head, err)
	}
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != `got "hello"` {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}

// TestForwardEarlyResponse checks that an origin answering before it read
// the request body is passed on, and the client connection is closed
// cleanly after it.
func TestForwardEarlyResponse(t *testing.T) {
	port := startRawOrigin(t, func(c net.Conn) {
		if _, err := readHead(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 8\r\n\r\ntoo big\n")
	})
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
	c := dialProxy(t, e)
	fmt.Fprintf(c, "POST http://origin.test:%d/ HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n", port)
	go c.Write(make([]byte, 64<<10)) // part of the body, then nothing
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || string(body) != "too big\n" || err != nil {
		t.Errorf("got %d %q %v, want 413 %q", resp.StatusCode, body, err, "too big\n")
	}
}

// TestServeClosesForwardedRequests checks that Serve, when it returns, closes
// a client connection whose forwarded request still waits for its origin.
func TestServeClosesForwardedRequests(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	reached := make(chan struct{}, 1)
	port := startRawOrigin(t, func(c net.Conn) {
		reached <- struct{}{}
		<-release // never answers while the test runs
	})
	c, stopServe := serveOwnListener(t, port)
	fmt.Fprintf(c, "GET http://127.0.0.1:%d/ HTTP/1.1\r\n\r\n", port)
	select {
	case <-reached:
	case <-time.After(ioTimeout):
		t.Fatal("the request did not reach the origin")
	}

	stopServe()
	// The client may get a 502 (its origin connection was closed first), and
	// then the end of its connection.
	got, err := io.ReadAll(c)
	if err, ok := err.(net.Error); ok && err.Timeout() {
		t.Errorf("client connection still open after Serve returned (read %q)", got)
	}
	if len(got) > 0 && !strings.HasPrefix(string(got), "HTTP/1.1 502 ") {
		t.Errorf("client read %q, want nothing or a 502", got)
	}
}

// TestHTTP10ClientGetsNoInformational checks that informational responses
// are not passed on to an HTTP/1.0 client.
func TestHTTP10ClientGetsNoInformational(t *testing.T) {
	port := startRawOrigin(t, func(c net.Conn) {
		if _, err := readHead(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	e := startProxy(t, []string{fmt.Sprintf("origin.test:%d", port)}, nil, map[string][]netip.Addr{"origin.test": loopback()})
	c := dialProxy(t, e)
	fmt.Fprintf(c, "GET http://origin.test:%d/ HTTP/1.0\r\n\r\n", port)
	got, err := io.ReadAll(c)
	if want := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"; err != nil || string(got) != want {
		t.Errorf("client read %q, %v; want %q", got, err, want)
	}
}
