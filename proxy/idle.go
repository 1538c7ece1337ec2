package proxy

import (
	"net"
	"sync/atomic"
	"time"
)

// idleWatch closes the connections of one exchange (a tunnel, a forwarded
// request) once no byte has moved through them, either way, for a timeout.
// Bytes are seen through the connections wrap returns. It leaves deadlines
// alone, so the exchange can still use them for its own purposes.
type idleWatch struct {
	timeout time.Duration
	start   time.Time    // the base of last, for a monotonic clock
	last    atomic.Int64 // time since start of the last byte either way
	fired   atomic.Bool
	done    chan struct{} // closed by stop
	ended   chan struct{} // closed when the watching goroutine returns
}

// watchIdle starts watching conns with the given timeout.
func watchIdle(timeout time.Duration, conns ...net.Conn) *idleWatch {
	w := &idleWatch{timeout: timeout, start: time.Now(), done: make(chan struct{}), ended: make(chan struct{})}
	go w.run(conns)
	return w
}

func (w *idleWatch) run(conns []net.Conn) {
	defer close(w.ended)
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	for {
		select {
		case <-w.done:
			return
		case <-t.C:
		}
		if rest := w.timeout - (time.Since(w.start) - time.Duration(w.last.Load())); rest > 0 {
			t.Reset(rest)
			continue
		}
		w.fired.Store(true)
		for _, c := range conns {
			c.Close()
		}
		return
	}
}

func (w *idleWatch) touch() { w.last.Store(int64(time.Since(w.start))) }

// stop ends the watch and reports whether it closed the connections.
func (w *idleWatch) stop() bool {
	close(w.done)
	<-w.ended
	return w.fired.Load()
}

// wrap returns c with every byte read or written counted as activity.
func (w *idleWatch) wrap(c net.Conn) net.Conn { return &watchedConn{Conn: c, w: w} }

type watchedConn struct {
	net.Conn
	w *idleWatch
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.w.touch()
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.w.touch()
	}
	return n, err
}

// CloseWrite half-closes the connection, or closes it when it cannot.
func (c *watchedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
