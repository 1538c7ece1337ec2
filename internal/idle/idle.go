// Package idle closes the connections of an exchange (a proxied tunnel, a
// forwarded flow) once no byte has moved through them, either way, for a
// timeout.
package idle

import (
	"net"
	"sync/atomic"
	"time"
)

// Watch watches one exchange. Bytes are seen through the connections Wrap
// returns. It leaves deadlines alone, so the exchange can still use them for
// its own purposes.
type Watch struct {
	timeout time.Duration
	start   time.Time    // the base of last, for a monotonic clock
	last    atomic.Int64 // time since start of the last byte either way
	fired   atomic.Bool
	done    chan struct{} // closed by stop
	ended   chan struct{} // closed when the watching goroutine returns
}

// Start starts watching: when no byte has moved through the wrapped
// connections for timeout, it closes conns. Call Stop when the exchange ends.
func Start(timeout time.Duration, conns ...net.Conn) *Watch {
	w := &Watch{timeout: timeout, start: time.Now(), done: make(chan struct{}), ended: make(chan struct{})}
	go w.run(conns)
	return w
}

func (w *Watch) run(conns []net.Conn) {
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

func (w *Watch) touch() { w.last.Store(int64(time.Since(w.start))) }

// Stop ends the watch and reports whether it closed the connections.
func (w *Watch) Stop() bool {
	close(w.done)
	<-w.ended
	return w.fired.Load()
}

// Wrap returns c with every byte read or written counted as activity. It has
// CloseWrite, which half-closes c or, when c cannot, closes it.
func (w *Watch) Wrap(c net.Conn) net.Conn { return &watchedConn{Conn: c, w: w} }

type watchedConn struct {
	net.Conn
	w *Watch
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
