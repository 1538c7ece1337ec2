// Package proxy is the policy proxy a sandbox reaches the network through: HTTP (CONNECT and absolute-URI requests) and SOCKS5 on one listener.
//
// The proxy resolves names itself, checks the name and every resolved address
// against a netpolicy.Policy, and dials the checked address (never the name
// again, so DNS cannot rebind between the check and the dial).
package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/idle"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

const (
	// defaultHandshakeTimeout bounds reading a request's headers or a SOCKS5
	// handshake, so a client that stalls only holds its own connection.
	defaultHandshakeTimeout = 30 * time.Second
	// dialTimeout bounds one TCP dial to one resolved address.
	dialTimeout = 10 * time.Second
	// resolveTimeout bounds one name resolution.
	resolveTimeout = 10 * time.Second
	// replyTimeout bounds writing a short reply (an error page, a SOCKS5
	// reply) to a client that does not read.
	replyTimeout = 10 * time.Second
	// maxHeaderBytes bounds a request line plus headers.
	maxHeaderBytes = 64 << 10
	// defaultMaxConns bounds the client connections one Server serves at
	// once, over all its listeners: one session's. Each holds up to two
	// sockets and three goroutines in the shim, so a runtime that opens
	// connections in a loop cannot exhaust the shim's file descriptors or
	// memory; 256 is far above what package managers and browsers open
	// (npm: 15 per origin, browsers: 6 per host).
	defaultMaxConns = 256
	// maxRefusing bounds the connections beyond the cap that are being told
	// so (a 503 to an HTTP client); beyond that they are closed unanswered.
	maxRefusing = 16
	// busyReplyTimeout bounds reading the first byte of, and answering, a
	// connection refused for the cap.
	busyReplyTimeout = time.Second
	// busyLogInterval is how often a refusal for the cap is logged at most;
	// the line counts the refusals since the last one.
	busyLogInterval = 10 * time.Second
	// defaultIdleTimeout closes a tunnel or forwarded request through which
	// no byte has moved either way for that long, so a runtime cannot hold
	// connections (and slots) open forever. It is above what NAT gateways
	// allow an idle TCP connection (AWS 350 s, Azure 4 min), which clients
	// already cope with, and above the keep-alive intervals of HTTP/2, gRPC
	// and SSH clients.
	defaultIdleTimeout = 10 * time.Minute
)

// Server is a policy proxy. Set its fields before calling Serve and do not
// change them afterwards.
type Server struct {
	// Policy decides which destinations may be reached; nil is the empty
	// policy (any name, public addresses only).
	Policy *netpolicy.Policy
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	}
	// Dial connects to a checked "ip:port"; nil means a net.Dialer. Each call
	// gets a context that ends after 10 s.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnViolation, if set, is called for every refusal, from the connection's
	// goroutine; it should return quickly.
	OnViolation func(netpolicy.Violation)
	// Logf, if set, receives one line per refusal or failed connection.
	Logf func(format string, args ...any)
	// HandshakeTimeout bounds reading a request's headers or a SOCKS5
	// handshake; 0 means 30 s.
	HandshakeTimeout time.Duration
	// MaxConns bounds the client connections served at once, over every
	// listener; 0 means 256. A connection beyond it is closed at once (an
	// HTTP client is first answered 503 with the reason).
	MaxConns int
	// IdleTimeout closes a tunnel or a forwarded request when no byte has
	// moved either way for that long; 0 means 10 min.
	IdleTimeout time.Duration
	// Interceptor, if set, serves the tunnels to the hosts it binds (the
	// hosts of the session's secrets) once the policy allowed and the
	// proxy dialled them; every other tunnel is relayed untouched.
	Interceptor Interceptor

	initOnce sync.Once
	slots    chan struct{} // one per client connection being served
	refusing chan struct{} // one per connection being refused for the cap
	busy     atomic.Int64  // refusals for the cap not logged yet
	busyLog  atomic.Int64  // when the last one was logged, in UnixNano
}

// Interceptor serves tunnels to the hosts it binds.
type Interceptor interface {
	Binds(host string, port int) bool
	// Intercept serves one tunnel to host:port (hosts is that one host):
	// buffered is what the client sent after its request and the proxy has
	// read already. It returns when the tunnel is served or handed on; the
	// proxy closes both connections then.
	Intercept(ctx context.Context, client net.Conn, buffered []byte, upstream net.Conn, hosts []string, port int)
}

// relay serves an established tunnel: intercepted when a secret is bound
// to its destination, else copied both ways.
func (s *Server) relay(ctx context.Context, cc *clientConn, up net.Conn, proto, host string, port int) {
	if s.Interceptor != nil && s.Interceptor.Binds(host, port) {
		s.intercept(ctx, cc, up, nil, host, port)
		return
	}
	if tunnel(cc, up, s.idleTimeout()) {
		s.logIdle(proto, host, port)
	}
}

// intercept hands the client's connection to the Interceptor, with what the
// client sent as the destination should see it first: head (a forwarded
// request's, rewritten), then what the proxy has read beyond.
func (s *Server) intercept(ctx context.Context, cc *clientConn, up net.Conn, head []byte, host string, port int) {
	cc.lr.N = 1<<63 - 1
	cc.SetDeadline(time.Time{})
	buffered := append([]byte(nil), head...)
	if n := cc.br.Buffered(); n > 0 {
		b, _ := cc.br.Peek(n)
		buffered = append(buffered, b...)
	}
	s.Interceptor.Intercept(ctx, cc.Conn, buffered, up, []string{host}, port)
}

// refusedError is a policy refusal.
type refusedError struct{ v netpolicy.Violation }

func (e *refusedError) Error() string { return "refused by policy: " + e.v.Reason }

// resolveError is a failure to resolve the destination's name.
type resolveError struct {
	host string
	err  error
}

func (e *resolveError) Error() string { return fmt.Sprintf("resolve %s: %v", e.host, e.err) }
func (e *resolveError) Unwrap() error { return e.err }

// Serve accepts connections on l until l is closed, each served on its own
// goroutine. When l is closed it returns nil, after closing the connections
// it accepted (tunnels included) and waiting for their goroutines.
func (s *Server) Serve(l net.Listener) error {
	s.initOnce.Do(func() {
		s.slots = make(chan struct{}, s.maxConns())
		s.refusing = make(chan struct{}, maxRefusing)
	})
	ctx, cancel := context.WithCancel(context.Background())
	set := &connSet{conns: make(map[net.Conn]struct{})}
	var wg sync.WaitGroup
	defer func() {
		cancel()
		set.closeAll()
		wg.Wait()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			if isTemporaryAcceptError(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logf("proxy: accept: %v; retrying in %v", err, backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		backoff = 0
		select {
		case s.slots <- struct{}{}:
		default:
			s.refuseBusy(set, &wg, c)
			continue
		}
		if !set.add(c) {
			<-s.slots
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-s.slots }()
			defer set.remove(c)
			defer c.Close()
			s.serveConn(ctx, set, c)
		}()
	}
}

func (s *Server) maxConns() int {
	if s.MaxConns > 0 {
		return s.MaxConns
	}
	return defaultMaxConns
}

// refuseBusy turns away a connection accepted beyond the cap, without
// blocking the accept loop: an HTTP client is answered 503 with the reason
// when a refusing slot is free, anything else (a SOCKS5 client, or any
// client while maxRefusing are being answered) is closed.
func (s *Server) refuseBusy(set *connSet, wg *sync.WaitGroup, c net.Conn) {
	msg := fmt.Sprintf("the proxy already serves %d connections of this session, the most it allows; close some and retry", cap(s.slots))
	s.logBusy(msg)
	select {
	case s.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	if !set.add(c) {
		<-s.refusing
		c.Close()
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() { <-s.refusing }()
		defer set.remove(c)
		defer c.Close()
		c.SetDeadline(time.Now().Add(busyReplyTimeout))
		lr := &io.LimitedReader{R: c, N: maxHeaderBytes}
		cc := &clientConn{Conn: c, lr: lr, br: bufio.NewReaderSize(lr, 4096)}
		if first, err := cc.br.Peek(1); err != nil || first[0] == socks5Version {
			return
		}
		if writeError(cc, 503, msg, "") == nil {
			lingerClose(cc)
		}
	}()
}

// logBusy logs a refusal for the cap, at most once per busyLogInterval, with
// the number of refusals since the last line.
func (s *Server) logBusy(msg string) {
	s.busy.Add(1)
	now := time.Now().UnixNano()
	last := s.busyLog.Load()
	if now-last < int64(busyLogInterval) || !s.busyLog.CompareAndSwap(last, now) {
		return
	}
	s.logf("proxy: refused %d connection(s): %s", s.busy.Swap(0), msg)
}

func isTemporaryAcceptError(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// connSet holds the connections of one Serve call, so they can all be closed
// when it returns.
type connSet struct {
	mu     sync.Mutex // guards the fields that follow
	conns  map[net.Conn]struct{}
	closed bool
}

// add records c; it returns false (and records nothing) once closeAll ran.
func (cs *connSet) add(c net.Conn) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		return false
	}
	cs.conns[c] = struct{}{}
	return true
}

func (cs *connSet) remove(c net.Conn) {
	cs.mu.Lock()
	delete(cs.conns, c)
	cs.mu.Unlock()
}

func (cs *connSet) closeAll() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	for c := range cs.conns {
		c.Close()
	}
}

// clientConn is an accepted connection with its buffered reader. lr caps how
// much the reader may pull from the connection while headers are read.
type clientConn struct {
	net.Conn
	lr *io.LimitedReader
	br *bufio.Reader
}

const socks5Version = 0x05

func (s *Server) serveConn(ctx context.Context, set *connSet, c net.Conn) {
	lr := &io.LimitedReader{R: c, N: maxHeaderBytes}
	cc := &clientConn{Conn: c, lr: lr, br: bufio.NewReaderSize(lr, 4096)}
	c.SetDeadline(time.Now().Add(s.handshakeTimeout()))
	first, err := cc.br.Peek(1)
	if err != nil {
		return
	}
	if first[0] == socks5Version {
		s.serveSOCKS5(ctx, set, cc)
		return
	}
	s.serveHTTP(ctx, set, cc)
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return defaultIdleTimeout
}

func (s *Server) logIdle(proto, host string, port int) {
	s.logf("proxy: %s %s: closed after %v with no bytes either way", proto, hostPort(host, port), s.idleTimeout())
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return defaultHandshakeTimeout
}

// connect checks host:port against the policy, resolves it, checks every
// address and dials the first checked address that answers. Refusals are
// *refusedError (and reported), resolution failures *resolveError.
func (s *Server) connect(ctx context.Context, proto, host string, port int) (net.Conn, error) {
	if netpolicy.IsHostName(host) {
		return s.connectHost(ctx, proto, host, port)
	}
	if d := s.Policy.CheckName(host, port); !d.Allow {
		return nil, s.refuse(proto, host, port, "", d.Reason)
	}
	addrs, err := s.resolve(ctx, host)
	if err != nil {
		s.logf("proxy: %s %s: %v", proto, hostPort(host, port), err)
		return nil, err
	}
	// Every address must pass: a name that resolves partly into a refused
	// range is refused as a whole.
	for _, ip := range addrs {
		if d := s.Policy.CheckAddr(host, ip, port); !d.Allow {
			return nil, s.refuse(proto, host, port, ip.String(), d.Reason)
		}
	}
	var firstErr error
	for _, ip := range addrs {
		c, err := s.dialAddr(ctx, netip.AddrPortFrom(ip.Unmap(), uint16(port)).String())
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	s.logf("proxy: %s %s: %v", proto, hostPort(host, port), firstErr)
	return nil, firstErr
}

// connectHost connects to the host's loopback for host.agentconnect.internal,
// as microsandbox's network does: judged as 127.0.0.1 (how policies name
// the host), then by the name, and dialled at 127.0.0.1.
func (s *Server) connectHost(ctx context.Context, proto, host string, port int) (net.Conn, error) {
	loopback := netip.MustParseAddr("127.0.0.1")
	var refusal string
	for _, candidate := range []string{loopback.String(), netpolicy.HostName} {
		d := s.Policy.CheckName(candidate, port)
		if d.Allow {
			d = s.Policy.CheckAddr(candidate, loopback, port)
		}
		if d.Allow {
			c, err := s.dialAddr(ctx, netip.AddrPortFrom(loopback, uint16(port)).String())
			if err != nil {
				s.logf("proxy: %s %s: %v", proto, hostPort(host, port), err)
			}
			return c, err
		}
		if refusal == "" {
			refusal = d.Reason
		}
	}
	return nil, s.refuse(proto, host, port, loopback.String(), refusal)
}

// resolve returns the addresses of host; an IP literal is returned as is,
// without DNS.
func (s *Server) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(trimBrackets(host)); err == nil {
		return []netip.Addr{ip}, nil
	}
	var r interface {
		LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	} = net.DefaultResolver
	if s.Resolver != nil {
		r = s.Resolver
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, &resolveError{host: host, err: err}
	}
	if len(addrs) == 0 {
		return nil, &resolveError{host: host, err: errors.New("no addresses")}
	}
	return addrs, nil
}

func (s *Server) dialAddr(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if s.Dial != nil {
		return s.Dial(ctx, "tcp", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (s *Server) refuse(proto, host string, port int, addr, reason string) error {
	v := netpolicy.Violation{Time: time.Now(), Protocol: proto, Host: host, Port: port, Addr: addr, Reason: reason}
	s.logf("proxy: refused %s %s: %s", proto, hostPort(host, port), reason)
	if s.OnViolation != nil {
		s.OnViolation(v)
	}
	return &refusedError{v: v}
}

func (s *Server) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// hostPort formats a client-supplied destination for logs, quoting the host
// so control characters cannot forge log lines.
func hostPort(host string, port int) string {
	return strconv.Quote(host) + ":" + strconv.Itoa(port)
}

func trimBrackets(host string) string {
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		return host[1 : len(host)-1]
	}
	return host
}

// parsePort parses a destination port, 1 to 65535.
func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s[0] == '+' {
		return 0, fmt.Errorf("invalid port %q", s)
	}
	return n, nil
}

// tunnel copies bytes both ways between the client and upstream until both
// directions end, or until no byte has moved either way for timeout (then
// it closes both and returns true). An EOF in one direction is passed on as a
// half-close (CloseWrite), so the other direction keeps flowing; an error
// ends both. Bytes the client sent early and that sit in br are sent first.
func tunnel(client *clientConn, upstream net.Conn, timeout time.Duration) (idled bool) {
	client.lr.N = 1<<63 - 1
	client.SetDeadline(time.Time{})
	w := idle.Start(timeout, client.Conn, upstream)
	c, up := w.Wrap(client.Conn), w.Wrap(upstream)
	done := make(chan error, 2)
	go func() {
		var err error
		if n := client.br.Buffered(); n > 0 {
			b, _ := client.br.Peek(n)
			_, err = up.Write(b)
		}
		if err == nil {
			_, err = io.Copy(up, c)
		}
		closeWrite(up)
		done <- err
	}()
	go func() {
		_, err := io.Copy(c, up)
		closeWrite(c)
		done <- err
	}()
	if err := <-done; err != nil {
		client.Close()
		upstream.Close()
	}
	<-done
	return w.Stop()
}

// closeWrite half-closes c, or closes it when it cannot half-close.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
