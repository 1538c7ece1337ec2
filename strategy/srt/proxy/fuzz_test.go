package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// requestSeeds are request heads and SOCKS5 greetings, good and bad.
var requestSeeds = []string{
	"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
	"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
	"POST http://a.test/p?q=1 HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc",
	"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
	"GET http://x/ HTTP/2.0\r\n\r\n",
	"GET  http://x/ HTTP/1.1\r\n\r\n",
	"G\x00T http://x/ HTTP/1.1\r\n\r\n",
	"GET http://x/ HTTP/1.1\nHost: x\n\n",
	"POST http://x/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext\r\nhello\r\n0\r\nT: 1\r\n\r\n",
	"\x05\x01\x00\x05\x01\x00\x03\x0bexample.com\x01\xbb",
	"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50",
	"\x05\x01\x00\x05\x01\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x50",
	"\x05\x00", "\x05\xff", "\x05\x01\x02",
}

// FuzzReadRequest compares the proxy's request head parsing with
// net/http.ReadRequest: what the proxy accepts is well formed (a token
// method, a target without spaces or control characters, token field
// names, values without control characters), and where both accept, they
// read the same method, target and version.
func FuzzReadRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		start, h, err := readHead(bufio.NewReader(bytes.NewReader(data)), maxHeaderBytes)
		var req *request
		if err == nil {
			req, err = parseRequest(start, h)
		}
		if err != nil {
			return
		}
		if !isToken(req.method) || req.target == "" || strings.ContainsAny(req.target, " \t") || !validText(req.target) {
			t.Fatalf("accepted request line %q", start)
		}
		for _, fl := range req.header {
			if !isToken(fl.name) || !validText(fl.value) || fl.value != strings.Trim(fl.value, " \t") {
				t.Fatalf("accepted header field %q: %q", fl.name, fl.value)
			}
		}
		theirs, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			return
		}
		if theirs.Method != req.method || theirs.RequestURI != req.target || (theirs.ProtoMinor == 1) != req.http11 {
			t.Fatalf("the proxy read %q %q (HTTP/1.1 %v), net/http %q %q %s", req.method, req.target, req.http11, theirs.Method, theirs.RequestURI, theirs.Proto)
		}
	})
}

// nowhere resolves every name to a documentation address, which the
// policy refuses, so that no fuzzed request leaves the test.
type nowhere struct{}

func (nowhere) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("192.0.2.1")}, nil
}

// FuzzServeConn feeds the proxy's connection handler (HTTP and SOCKS5 on
// one port) arbitrary bytes: it answers or closes, and returns within its
// handshake bound, never panics, and never dials (every destination is one
// the policy refuses).
func FuzzServeConn(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s))
	}
	// One name is allowed, and nowhere resolves it to a documentation
	// address the policy refuses: whatever a request asks for (an IP
	// literal too), the proxy has nothing it may dial. (With no policy, a
	// public IP literal is allowed by design: the fuzzer found that.)
	policy, err := netpolicy.New([]string{"allowed.example"}, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &Server{Policy: policy, Resolver: nowhere{}, HandshakeTimeout: 100 * time.Millisecond,
			Dial: func(context.Context, string, string) (net.Conn, error) {
				t.Error("the proxy dialled")
				return nil, errors.New("no dial in a fuzz test")
			}}
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.serveConn(context.Background(), &connSet{conns: map[net.Conn]struct{}{}}, server)
			server.Close()
		}()
		go func() {
			// All of it, then the end: the proxy does not wait for more
			// (a keep-alive connection would idle until its timeout).
			client.SetDeadline(time.Now().Add(2 * time.Second))
			client.Write(data)
			client.Close()
		}()
		go io.Copy(io.Discard, client)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("the proxy still serves %q after 5 s", data)
		}
		client.Close()
	})
}
