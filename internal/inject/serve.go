package inject

import (
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
	"sync/atomic"
	"time"
)

const (
	// handshakeTimeout bounds a TLS handshake and a request's headers, so
	// that a client that stalls holds only its own connection.
	handshakeTimeout = 30 * time.Second
	// idleTimeout closes a tunnel with no request for that long, as the
	// proxy closes an idle plain tunnel.
	idleTimeout = 10 * time.Minute
)

// hopByHop are the headers of one connection, not of the request.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// tunnel is one intercepted connection: the session's side, the host's
// side, and a round tripper over the latter.
type tunnel struct {
	in *Injector
	// hosts are the names a request on it may give as its Host: over TLS
	// the one its server name chose; over plain HTTP each name the session
	// may have meant by the address (each bound explicitly).
	hosts []string
	port  int
	plain bool
	rt    http.RoundTripper
	h2up  bool
	conn  *oneConnListener
}

// serve forwards the requests on client to the host over upstream (both
// TLS, or both plain when plain), until either side is done.
func (in *Injector) serve(ctx context.Context, client, upstream net.Conn, hosts []string, port int, plain bool) error {
	var h2up bool
	if uc, ok := upstream.(*tls.Conn); ok {
		h2up = uc.ConnectionState().NegotiatedProtocol == "h2"
	}
	// The tunnel's one connection to the host: the transport may not dial
	// another, which the policy has not allowed.
	var dialled atomic.Bool
	dial := func(context.Context, string, string) (net.Conn, error) {
		if dialled.Swap(true) {
			return nil, errors.New("the host closed the tunnel's connection")
		}
		return upstream, nil
	}
	tr := &http.Transport{ForceAttemptHTTP2: true, DisableCompression: true} // what comes back is decoded here, once
	scheme := "https"
	if plain {
		tr.DialContext, scheme = dial, "http"
	} else {
		tr.DialTLSContext = dial
	}
	cc, err := tr.NewClientConn(ctx, scheme, net.JoinHostPort(hosts[0], strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("the host's side: %w", err)
	}
	defer cc.Close()
	l := newOneConnListener(client)
	t := &tunnel{in: in, hosts: hosts, port: port, plain: plain, rt: cc, h2up: h2up, conn: l}
	srv := &http.Server{Handler: t, ReadHeaderTimeout: handshakeTimeout, IdleTimeout: idleTimeout, ConnState: l.connState}
	srv.Serve(l)
	l.wait() // a hijacked connection (an upgrade) is served until it ends
	return nil
}

// ServeHTTP forwards one request of the session to the host.
func (t *tunnel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, ok := t.sameHost(r.Host)
	if !ok {
		dest := hostPort(t.hosts, t.port)
		t.in.cfg.Logf("secret injection for %s: refused a request for %q on it", dest, r.Host)
		http.Error(w, fmt.Sprintf("agentconnect: this connection was opened to %s; a request for %s cannot use it", dest, r.Host), http.StatusMisdirectedRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = "https", r.Host
	if t.plain {
		out.URL.Scheme = "http"
	}
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
	made := t.in.swapRequest(out.Header, host, t.port, t.plain)
	renewed := t.in.renewedAt(host, t.port, t.plain)
	if err := t.in.swapBody(out, renewed); err != nil {
		http.Error(w, fmt.Sprintf("agentconnect: %s:%d: %v", host, t.port, err), http.StatusBadGateway)
		return
	}
	resp, err := t.rt.RoundTrip(out)
	if err != nil {
		http.Error(w, fmt.Sprintf("agentconnect: %s:%d: %v", host, t.port, err), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.upgraded(w, resp, t.in.pairs(made))
		t.conn.finish()
		return
	}
	body := io.Reader(resp.Body)
	switch enc := strings.ToLower(resp.Header.Get("Content-Encoding")); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			http.Error(w, fmt.Sprintf("agentconnect: %s:%d sent a gzip body that does not decode: %v", host, t.port, err), http.StatusBadGateway)
			return
		}
		body = zr
		resp.Header.Del("Content-Encoding")
	default:
		// Fail closed: what cannot be read cannot be checked for the value.
		http.Error(w, fmt.Sprintf("agentconnect: %s:%d answered in the %q encoding, which cannot be checked for the secret's value", host, t.port, enc), http.StatusBadGateway)
		return
	}
	// After the renewal: a new value is one to redact too.
	if body, err = t.in.renew(resp, body, renewed); err != nil {
		http.Error(w, fmt.Sprintf("agentconnect: %s:%d: %v", host, t.port, err), http.StatusBadGateway)
		return
	}
	pairs := t.in.pairs(made)
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

// sameHost reports which of the hosts the connection was opened to a
// request's Host names, with the connection's port.
func (t *tunnel) sameHost(hostport string) (string, bool) {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		h, p = hostport, "443"
		if t.plain {
			p = "80"
		}
	}
	if p != strconv.Itoa(t.port) {
		return "", false
	}
	h = strings.TrimSuffix(strings.Trim(h, "[]"), ".")
	for _, host := range t.hosts {
		if strings.EqualFold(h, host) {
			return host, true
		}
	}
	return "", false
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

// oneConnListener accepts one connection, then blocks until closed. It
// hands out the connection itself: the server speaks HTTP/2 only on a
// *tls.Conn that negotiated it.
type oneConnListener struct {
	conn       chan net.Conn
	addr       net.Addr
	closed     chan struct{}
	closeOnce  sync.Once
	done       chan struct{}
	finishOnce sync.Once
}

func newOneConnListener(c net.Conn) *oneConnListener {
	l := &oneConnListener{conn: make(chan net.Conn, 1), addr: c.LocalAddr(), closed: make(chan struct{}), done: make(chan struct{})}
	l.conn <- c
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
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return l.addr }

// connState stops accepting once the connection is taken over or closed,
// and counts it served when closed.
func (l *oneConnListener) connState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateClosed:
		l.Close()
		l.finish()
	case http.StateHijacked:
		l.Close()
	}
}

// finish marks the connection served: closed by the server, or by the
// handler that hijacked it, when that handler is done.
func (l *oneConnListener) finish() { l.finishOnce.Do(func() { close(l.done) }) }

// wait returns once the connection is served.
func (l *oneConnListener) wait() { <-l.done }
