package inject

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/net/http2"
)

// hopByHop are the headers of one connection, not of the request.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// tunnel is one intercepted connection: the session's TLS side, the host's
// TLS side, and a round tripper over the latter.
type tunnel struct {
	in   *Injector
	host string
	port int
	rt   http.RoundTripper
	h2up bool
}

func (in *Injector) serve(ctx context.Context, client, upstream *tls.Conn, host string, port int) error {
	t := &tunnel{in: in, host: host, port: port}
	if upstream.ConnectionState().NegotiatedProtocol == "h2" {
		// No transparent gzip: what comes back is decoded here, once.
		cc, err := (&http2.Transport{DisableCompression: true}).NewClientConn(upstream)
		if err != nil {
			return fmt.Errorf("%s:%d: HTTP/2 upstream: %w", host, port, err)
		}
		defer cc.Close()
		t.rt, t.h2up = cc, true
	} else {
		t.rt = &h1Conn{c: upstream, br: bufio.NewReader(upstream)}
	}
	if client.ConnectionState().NegotiatedProtocol == "h2" {
		(&http2.Server{}).ServeConn(client, &http2.ServeConnOpts{Context: ctx, Handler: t})
		return nil
	}
	l := newOneConnListener(client)
	srv := &http.Server{Handler: t, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed || s == http.StateHijacked {
			l.Close()
		}
	}}
	srv.Serve(l)
	l.wait() // a hijacked connection (an upgrade) is served until it ends
	return nil
}

// ServeHTTP forwards one request of the session to the host.
func (t *tunnel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !t.sameHost(r.Host) {
		t.in.cfg.Logf("secret injection for %s:%d: refused a request for %q on it", t.host, t.port, r.Host)
		http.Error(w, fmt.Sprintf("agentconnect: this connection was opened to %s:%d; a request for %s cannot use it", t.host, t.port, r.Host), http.StatusMisdirectedRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = "https", r.Host
	upgrade := r.Header.Get("Upgrade")
	for _, h := range hopByHop {
		out.Header.Del(h)
	}
	if upgrade != "" && !t.h2up && r.ProtoMajor == 1 {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", upgrade)
	}
	// An encoded answer could hide an echo of the value: ask for none.
	out.Header.Del("Accept-Encoding")
	pairs := t.in.pairs(t.in.swapRequest(out.Header, t.host, t.port))
	resp, err := t.rt.RoundTrip(out)
	if err != nil {
		http.Error(w, fmt.Sprintf("agentconnect: %s:%d: %v", t.host, t.port, err), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.upgraded(w, resp, pairs)
		return
	}
	body := io.Reader(resp.Body)
	switch enc := strings.ToLower(resp.Header.Get("Content-Encoding")); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			http.Error(w, fmt.Sprintf("agentconnect: %s:%d sent a gzip body that does not decode: %v", t.host, t.port, err), http.StatusBadGateway)
			return
		}
		body = zr
		resp.Header.Del("Content-Encoding")
	default:
		// Fail closed: what cannot be read cannot be checked for the value.
		http.Error(w, fmt.Sprintf("agentconnect: %s:%d answered in the %q encoding, which cannot be checked for the secret's value", t.host, t.port, enc), http.StatusBadGateway)
		return
	}
	redactHeader(resp.Header, pairs)
	for _, h := range hopByHop {
		resp.Header.Del(h)
	}
	resp.Header.Del("Content-Length") // redaction may change it
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	for k := range resp.Trailer {
		w.Header().Add("Trailer", k)
	}
	w.WriteHeader(resp.StatusCode)
	copyFlushing(w, newRedactor(body, pairs))
	redactHeader(resp.Trailer, pairs)
	for k, v := range resp.Trailer {
		w.Header()[k] = v
	}
}

// sameHost reports whether a request's Host names the host and port the
// connection was opened to.
func (t *tunnel) sameHost(hostport string) bool {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		h, p = hostport, "443"
	}
	return strings.EqualFold(strings.Trim(h, "[]"), t.host) && p == strconv.Itoa(t.port)
}

// upgraded relays an upgraded connection (WebSocket) both ways; what the
// host sends is redacted too.
func (t *tunnel) upgraded(w http.ResponseWriter, resp *http.Response, pairs [][2][]byte) {
	up, ok := resp.Body.(io.ReadWriteCloser)
	hj, canHijack := w.(http.Hijacker)
	if !ok || !canHijack {
		http.Error(w, "agentconnect: this upgrade cannot be relayed", http.StatusBadGateway)
		return
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	redactHeader(resp.Header, pairs)
	resp.Body = http.NoBody
	if err := resp.Write(conn); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(up, brw) // the session's side, as it is
		up.Close()
		close(done)
	}()
	io.Copy(conn, newRedactor(up, pairs))
	conn.Close()
	<-done
}

func copyFlushing(w http.ResponseWriter, r io.Reader) {
	f, _ := w.(http.Flusher)
	var buf [32 << 10]byte
	for {
		n, err := r.Read(buf[:])
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if f != nil {
				f.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}

// h1Conn is HTTP/1.1 over the one connection of a tunnel: one request at a
// time, the next once the last answer's body is read or closed.
type h1Conn struct {
	mu     sync.Mutex // held from a request until its answer's body is done
	c      net.Conn
	br     *bufio.Reader
	broken bool
}

func (h *h1Conn) RoundTrip(req *http.Request) (*http.Response, error) {
	h.mu.Lock()
	if h.broken {
		h.mu.Unlock()
		return nil, errors.New("the host closed the connection")
	}
	if err := req.Write(h.c); err != nil {
		h.broken = true
		h.mu.Unlock()
		return nil, err
	}
	resp, err := http.ReadResponse(h.br, req)
	if err != nil {
		h.broken = true
		h.mu.Unlock()
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		h.broken = true // the connection is the upgrade's now
		resp.Body = &upgradedConn{Reader: h.br, Conn: h.c, done: h.mu.Unlock}
		return resp, nil
	}
	if resp.Close {
		h.broken = true
	}
	resp.Body = &doneBody{ReadCloser: resp.Body, done: h.mu.Unlock}
	return resp, nil
}

// doneBody calls done once, when its body is read to the end or closed.
type doneBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *doneBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(b.done)
	}
	return n, err
}

func (b *doneBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

// upgradedConn is the host's side of an upgraded connection.
type upgradedConn struct {
	io.Reader
	net.Conn
	once sync.Once
	done func()
}

func (u *upgradedConn) Read(p []byte) (int, error) { return u.Reader.Read(p) }

func (u *upgradedConn) Close() error {
	u.once.Do(u.done)
	return u.Conn.Close()
}

// oneConnListener accepts one connection, then blocks until closed.
type oneConnListener struct {
	conn   chan net.Conn
	addr   net.Addr
	closed chan struct{}
	once   sync.Once
	served chan struct{}
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{conn: make(chan net.Conn, 1), addr: c.LocalAddr(), closed: make(chan struct{}), served: make(chan struct{})}
	l.conn <- &trackedConn{Conn: c, done: l.served}
	return l
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conn:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }

// wait returns once the connection is closed, by the server or by the
// handler that hijacked it.
func (l *oneConnListener) wait() { <-l.served }

type trackedConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}
