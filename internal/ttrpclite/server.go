package ttrpclite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// ErrServerClosed is what Serve returns once Shutdown or Close stopped it.
var ErrServerClosed = errors.New("ttrpc: server closed")

// Method serves one unary call: the encoded request in, the encoded
// response out. Its error travels as its errdefs code and its text.
type Method func(ctx context.Context, req []byte) ([]byte, error)

// Server serves unary ttrpc calls. A call's context ends at the deadline
// its client sent, and when its connection closes.
type Server struct {
	services map[string]map[string]Method
	sameUser bool

	mu        sync.Mutex // guards the fields below
	listeners map[net.Listener]struct{}
	conns     map[*serverConn]struct{}
	inFlight  int           // calls read and not yet answered
	idle      chan struct{} // closed when inFlight drops to 0
	stopped   bool          // accepts no more connections
	closing   bool          // takes no more calls
}

// NewServer returns a server. With sameUser it serves only peers of its own
// effective uid and gid (SO_PEERCRED), as the library's
// UnixSocketRequireSameUser handshaker does.
func NewServer(sameUser bool) *Server {
	return &Server{
		services:  map[string]map[string]Method{},
		sameUser:  sameUser,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*serverConn]struct{}{},
	}
}

// Register serves service's methods. Call it before Serve.
func (s *Server) Register(service string, methods map[string]Method) {
	if _, ok := s.services[service]; ok {
		panic(fmt.Sprintf("ttrpclite: service %s registered twice", service))
	}
	s.services[service] = methods
}

// Serve accepts connections on l until Shutdown or Close.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	backoff := time.Duration(0)
	for {
		conn, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			stopped := s.stopped
			s.mu.Unlock()
			if stopped {
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: wait and try again,
			// as the library does, rather than stop serving the session.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if s.sameUser && !samePeer(conn) {
			conn.Close()
			continue
		}
		sc := &serverConn{server: s, conn: conn}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			conn.Close()
			return ErrServerClosed
		}
		s.conns[sc] = struct{}{}
		s.mu.Unlock()
		go sc.serve()
	}
}

// samePeer reports whether the peer of a unix connection runs as this
// process's effective uid and gid.
func samePeer(conn net.Conn) bool {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return false
	}
	return int(cred.Uid) == os.Geteuid() && int(cred.Gid) == os.Getegid()
}

// Shutdown stops accepting, waits until no call is in flight (each answer
// written) or ctx ends, then closes every connection.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closeListenersLocked()
	for s.inFlight > 0 {
		idle := s.idle
		s.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			s.Close()
			return ctx.Err()
		}
		s.mu.Lock()
	}
	s.closing = true
	s.mu.Unlock()
	return s.Close()
}

// Close stops accepting and closes every connection now; calls in flight
// see their context end.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closing = true
	s.closeListenersLocked()
	conns := s.conns
	s.conns = map[*serverConn]struct{}{}
	s.mu.Unlock()
	for sc := range conns {
		sc.conn.Close()
	}
	return nil
}

func (s *Server) closeListenersLocked() {
	s.stopped = true
	for l := range s.listeners {
		l.Close()
	}
}

// begin counts a call in flight; false once the server is closing.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	if s.inFlight == 0 {
		s.idle = make(chan struct{})
	}
	s.inFlight++
	return true
}

func (s *Server) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight--
	if s.inFlight == 0 {
		close(s.idle)
	}
}

type serverConn struct {
	server  *Server
	conn    net.Conn
	writeMu sync.Mutex
}

// serve reads requests until the connection ends; each runs in a goroutine
// of its own, so a blocked call (Wait) holds up no other.
func (sc *serverConn) serve() {
	connCtx, cancel := context.WithCancel(context.Background())
	ctx := context.WithValue(connCtx, connDoneKey{}, connCtx.Done())
	defer func() {
		cancel()
		sc.conn.Close()
		sc.server.mu.Lock()
		delete(sc.server.conns, sc)
		sc.server.mu.Unlock()
	}()
	br := bufio.NewReader(sc.conn)
	var hbuf [headerLength]byte
	var last uint32
	for {
		h, err := readHeader(br, &hbuf)
		if err != nil {
			return
		}
		if h.length > MaxMessage {
			if _, err := br.Discard(int(h.length)); err != nil {
				return
			}
			sc.reply(h.streamID, response{code: errdefs.CodeResourceExhausted,
				message: fmt.Sprintf("message length %d exceed maximum message size of %d", h.length, MaxMessage)})
			continue
		}
		data := make([]byte, h.length)
		if _, err := io.ReadFull(br, data); err != nil {
			return
		}
		switch {
		case h.streamID%2 != 1:
			sc.reply(h.streamID, response{code: errdefs.CodeInvalidArgument, message: "StreamID must be odd for client initiated streams"})
			continue
		case h.typ != typeRequest:
			sc.reply(h.streamID, response{code: errdefs.CodeInvalidArgument, message: "this server serves unary calls only: no stream data"})
			continue
		case h.streamID <= last:
			sc.reply(h.streamID, response{code: errdefs.CodeInvalidArgument, message: "StreamID cannot be re-used and must increment"})
			continue
		}
		last = h.streamID
		var req request
		if err := req.unmarshal(data); err != nil {
			sc.reply(h.streamID, response{code: errdefs.CodeInvalidArgument, message: fmt.Sprintf("unmarshal request error: %v", err)})
			continue
		}
		method, code, msg := sc.server.lookup(req.service, req.method)
		if method == nil {
			sc.reply(h.streamID, response{code: code, message: msg})
			continue
		}
		if !sc.server.begin() {
			return
		}
		go sc.call(ctx, h.streamID, method, req)
	}
}

// connDoneKey carries, in a call's context, the end of the connection the
// call came on.
type connDoneKey struct{}

// ConnDone is closed when the connection a call came on ends: what a call
// starts for as long as its caller stays connected watches it. It is nil
// outside a served call.
func ConnDone(ctx context.Context) <-chan struct{} {
	done, _ := ctx.Value(connDoneKey{}).(<-chan struct{})
	return done
}

func (s *Server) lookup(service, method string) (Method, errdefs.Code, string) {
	methods, ok := s.services[service]
	if !ok {
		return nil, errdefs.CodeUnimplemented, "service " + service
	}
	m, ok := methods[method]
	if !ok {
		return nil, errdefs.CodeUnimplemented, "method " + method
	}
	return m, errdefs.CodeOK, ""
}

func (sc *serverConn) call(ctx context.Context, id uint32, method Method, req request) {
	defer sc.server.end()
	if req.timeoutNano > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.timeoutNano))
		defer cancel()
	}
	payload, err := method(ctx, req.payload)
	resp := response{payload: payload}
	if err != nil {
		resp = response{code: errdefs.CodeOf(err), message: err.Error()}
	}
	sc.reply(id, resp)
}

// reply writes a response frame; a connection that cannot take it is closed.
func (sc *serverConn) reply(id uint32, resp response) {
	data := resp.marshal()
	if len(data) > MaxMessage {
		data = (&response{code: errdefs.CodeResourceExhausted,
			message: fmt.Sprintf("a response of %d bytes is over ttrpc's %d-byte limit", len(data), MaxMessage)}).marshal()
	}
	sc.writeMu.Lock()
	defer sc.writeMu.Unlock()
	if _, err := sc.conn.Write(appendFrame(nil, id, typeResponse, data)); err != nil {
		sc.conn.Close()
	}
}
