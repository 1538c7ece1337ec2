package vmtransport

import (
	"bufio"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// The serial transport is one byte stream (a virtio-serial port, seen by the
// host as QEMU's chardev socket) carrying a yamux session. Before the session
// each side says hello, and each skips whatever precedes the other's hello:
// the port keeps no framing across a reconnect, so bytes of an earlier
// session can still be in flight, and the host may connect long before the
// guest agent runs. The host speaks first; the guest answers once it serves.
const (
	hostHello  = "\nagentconnect-serial v1 host\n"
	guestHello = "\nagentconnect-serial v1 guest\n"
)

// Yamux settings. A wedged peer is detected by keepalive pings: one every
// keepAliveEvery, each answered within keepAliveTimeout (which yamux also
// uses as the bound on handing a frame to the port) or the session ends.
// The timeout is generous because a TCG guest under load can stall for
// seconds.
const (
	defaultKeepAliveEvery   = 10 * time.Second
	defaultKeepAliveTimeout = 20 * time.Second
	// streamOpenTimeout bounds the wait for the peer to accept a stream;
	// yamux ends the whole session when it passes.
	streamOpenTimeout = 30 * time.Second
	// streamCloseTimeout bounds how long a half-closed stream waits for the
	// peer's close before it is reset.
	streamCloseTimeout = time.Minute
)

// Option tunes ListenSerial and NewSerialClient.
type Option func(*options)

type options struct {
	logf             func(format string, args ...any)
	keepAliveEvery   time.Duration
	keepAliveTimeout time.Duration
}

// WithLogf routes the transport's log lines (yamux's included) to logf; by
// default they are discarded.
func WithLogf(logf func(format string, args ...any)) Option {
	return func(o *options) { o.logf = logf }
}

// WithKeepAlive sets how often the session pings its peer and how long an
// answer may take before the session is declared dead.
func WithKeepAlive(every, timeout time.Duration) Option {
	return func(o *options) {
		o.keepAliveEvery = every
		o.keepAliveTimeout = timeout
	}
}

func buildOptions(opts []Option) options {
	o := options{
		logf:             func(string, ...any) {},
		keepAliveEvery:   defaultKeepAliveEvery,
		keepAliveTimeout: defaultKeepAliveTimeout,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func (o options) yamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = true
	c.KeepAliveInterval = o.keepAliveEvery
	c.ConnectionWriteTimeout = o.keepAliveTimeout
	c.StreamOpenTimeout = streamOpenTimeout
	c.StreamCloseTimeout = streamCloseTimeout
	c.LogOutput = nil
	c.Logger = yamuxLogger{o.logf}
	return c
}

// yamuxLogger sends yamux's log lines to a Logf.
type yamuxLogger struct{ logf func(string, ...any) }

func (l yamuxLogger) Print(v ...any)                 { l.logf("%s", fmt.Sprint(v...)) }
func (l yamuxLogger) Printf(format string, v ...any) { l.logf(format, v...) }
func (l yamuxLogger) Println(v ...any)               { l.logf("%s", fmt.Sprint(v...)) }

// skipTo reads from r until it has read hello, discarding what precedes it.
func skipTo(r *bufio.Reader, hello string) error {
	matched := 0
	for matched < len(hello) {
		b, err := r.ReadByte()
		if err != nil {
			return err
		}
		switch {
		case b == hello[matched]:
			matched++
		case b == hello[0]:
			// The hellos start with a byte that occurs nowhere else in
			// them, so a mismatch can only restart the match here.
			matched = 1
		default:
			matched = 0
		}
	}
	return nil
}

// bufferedPort is a port whose reads go through the reader that skipped the
// hello, so that nothing it buffered is lost.
type bufferedPort struct {
	*bufio.Reader
	io.Writer
	io.Closer
}
