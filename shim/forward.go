package shim

import (
	"context"
	"errors"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// Dialer is a run whose session has a network of its own (srt's network
// namespace, microsandbox's guest): it connects to a port inside it, for
// a forward from the host's loopback.
type Dialer interface {
	DialInside(ctx context.Context, port int) (net.Conn, error)
}

// Bounds of the forwards of one run.
const (
	// maxForwards bounds the listeners a run holds.
	maxForwards = 32
	// maxForwardConns bounds the connections open through one forward.
	maxForwardConns = 256
	// forwardIdle closes a connection through which no byte has moved
	// either way for that long, as the session's proxy does.
	forwardIdle = 10 * time.Minute
)

// forward is one listener on the host's loopback and its connections.
type forward struct {
	l        net.Listener
	port     int // inside
	detached bool
	conns    atomic.Uint64 // served so far
	slots    chan struct{}
	stop     chan struct{} // closed to end the forward
	stopOnce sync.Once
	done     chan struct{} // closed once the accept loop and its connections are gone
}

// forwards are a run's forwards, by their host address.
type forwards struct {
	mu     sync.Mutex
	all    map[string]*forward
	closed bool // the run has ended: no new forward
}

func (f *forward) info() *shimv1.Forward {
	host, port, _ := net.SplitHostPort(f.l.Addr().String())
	p, _ := strconv.Atoi(port)
	return &shimv1.Forward{Address: net.JoinHostPort(host, port), HostPort: uint32(p), Port: uint32(f.port), Detached: f.detached, Connections: f.conns.Load()}
}

// Forward opens a listener on 127.0.0.1 (port req.HostPort, or one the
// kernel picks) whose connections reach port req.Port inside the session.
func (s *service) Forward(ctx context.Context, req *shimv1.ForwardRequest) (*shimv1.ForwardResponse, error) {
	if req.Port < 1 || req.Port > 65535 || req.HostPort > 65535 {
		return nil, errdefs.InvalidArgument("forward: port %d to host port %d: want ports from 1 to 65535 (host port 0: any free one)", req.Port, req.HostPort)
	}
	if s.rec.Strategy == strategy.Host {
		return nil, errdefs.FailedPrecondition("session %s runs on host, in the host's own network: connect to 127.0.0.1:%d directly", s.rec.ID, req.Port)
	}
	run := s.current()
	if run == nil {
		return nil, errdefs.FailedPrecondition("session %s is not running: a forward reaches into a running session", s.rec.ID)
	}
	d, ok := run.(Dialer)
	if !ok {
		return nil, errdefs.FailedPrecondition("session %s: its %s runner cannot reach into the session's network", s.rec.ID, s.rec.Strategy)
	}
	s.fwd.mu.Lock()
	defer s.fwd.mu.Unlock()
	if s.fwd.closed {
		return nil, errdefs.FailedPrecondition("session %s is not running: a forward reaches into a running session", s.rec.ID)
	}
	if len(s.fwd.all) >= maxForwards {
		return nil, errdefs.ResourceExhausted("session %s has %d forwards, the most it may have: remove one (session unforward)", s.rec.ID, maxForwards)
	}
	// Loopback only: a forward is never published beyond this host.
	l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(req.HostPort))))
	if err != nil {
		return nil, errdefs.FailedPrecondition("forward to port %d of session %s: listen on 127.0.0.1:%d: %v", req.Port, s.rec.ID, req.HostPort, err)
	}
	f := &forward{l: l, port: int(req.Port), detached: req.Detach, slots: make(chan struct{}, maxForwardConns),
		stop: make(chan struct{}), done: make(chan struct{})}
	if s.fwd.all == nil {
		s.fwd.all = map[string]*forward{}
	}
	s.fwd.all[l.Addr().String()] = f
	go s.serveForward(f, d)
	// One not detached lasts as long as the supervisor that asked for it
	// stays connected: a supervisor that dies takes its commands' forwards
	// with it, and the next one finds none of theirs.
	if done := ttrpclite.ConnDone(ctx); done != nil && !req.Detach {
		go func() {
			select {
			case <-done:
				s.fwd.mu.Lock()
				delete(s.fwd.all, l.Addr().String())
				s.fwd.mu.Unlock()
				f.close()
				s.log.WithField("forward", l.Addr().String()).Info("forward closed: its supervisor went away")
			case <-f.stop:
			}
		}()
	}
	s.log.WithFields(map[string]any{"forward": l.Addr().String(), "port": req.Port, "detached": req.Detach}).Info("forward opened")
	return &shimv1.ForwardResponse{Forward: f.info()}, nil
}

// serveForward accepts until the listener closes, then waits for the
// forward's connections to end.
func (s *service) serveForward(f *forward, d Dialer) {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		close(f.done)
	}()
	for {
		c, err := f.l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.WithError(err).WithField("forward", f.l.Addr().String()).Warn("forward stopped accepting")
			}
			return
		}
		select {
		case f.slots <- struct{}{}:
		default:
			c.Close() // full: refused, as the proxy refuses its 257th
			continue
		}
		f.conns.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-f.slots }()
			s.relayForward(c, f, d)
		}()
	}
}

// relayForward connects c to the forward's port inside and copies both
// ways until both sides end, the connection idles, or the forward closes.
func (s *service) relayForward(c net.Conn, f *forward, d Dialer) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	inside, err := d.DialInside(ctx, f.port)
	cancel()
	if err != nil {
		s.log.WithError(err).WithField("forward", f.l.Addr().String()).Debug("forward: connect inside")
		return
	}
	defer inside.Close()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	copied := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		// Half-close, so that a request's end reaches the server and its
		// answer still comes back.
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		copied <- struct{}{}
	}
	go pipe(inside, c)
	go pipe(c, inside)
	tick := time.NewTicker(forwardIdle / 10)
	defer tick.Stop()
	for ended := 0; ended < 2; {
		select {
		case <-copied:
			ended++
			continue
		case <-f.stop:
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) < forwardIdle {
				continue
			}
		}
		// Closed, or idle: both copies end on the closed connections.
		c.Close()
		inside.Close()
		for ; ended < 2; ended++ {
			<-copied
		}
	}
}

// Unforward closes the forward at req.Address.
func (s *service) Unforward(_ context.Context, req *shimv1.UnforwardRequest) (*shimv1.UnforwardResponse, error) {
	s.fwd.mu.Lock()
	f, ok := s.fwd.all[req.Address]
	delete(s.fwd.all, req.Address)
	s.fwd.mu.Unlock()
	if !ok {
		return nil, errdefs.NotFound("session %s has no forward at %s (session forwards lists them)", s.rec.ID, req.Address)
	}
	f.close()
	s.log.WithField("forward", req.Address).Info("forward closed")
	return &shimv1.UnforwardResponse{Closed: 1}, nil
}

// close stops f's listener and its connections.
func (f *forward) close() {
	f.stopOnce.Do(func() {
		close(f.stop)
		f.l.Close()
	})
}

// ListForwards lists the run's forwards, by host port.
func (s *service) ListForwards(context.Context, *shimv1.ListForwardsRequest) (*shimv1.ListForwardsResponse, error) {
	s.fwd.mu.Lock()
	defer s.fwd.mu.Unlock()
	resp := &shimv1.ListForwardsResponse{}
	for _, f := range s.fwd.all {
		resp.Forwards = append(resp.Forwards, f.info())
	}
	sort.Slice(resp.Forwards, func(i, j int) bool { return resp.Forwards[i].HostPort < resp.Forwards[j].HostPort })
	return resp, nil
}

// closeForwards closes every forward of the run, at its end, and waits
// for their connections to go.
func (s *service) closeForwards() {
	s.fwd.mu.Lock()
	all := s.fwd.all
	s.fwd.all = nil
	s.fwd.closed = true
	s.fwd.mu.Unlock()
	for _, f := range all {
		f.close()
	}
	for _, f := range all {
		<-f.done
	}
}
