package vmtransport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

// SerialClient is the host side of the serial transport: a yamux client
// session over QEMU's chardev socket for the agent's port
// (-chardev socket,id=agent,path=SOCK,server=on,wait=off
// -device virtserialport,chardev=agent,name=agentconnect).
type SerialClient struct {
	conn net.Conn
	sess *yamux.Session
}

// socketRetryEvery is how often NewSerialClient retries connecting while
// QEMU has not created its socket yet.
const socketRetryEvery = 50 * time.Millisecond

// NewSerialClient connects to QEMU's chardev socket at socketPath (retrying
// while QEMU has not created it yet), and returns once the guest agent has
// answered, which is after the guest booted: bound the wait with ctx.
func NewSerialClient(ctx context.Context, socketPath string, opts ...Option) (*SerialClient, error) {
	conn, err := DialWithRetry(ctx, unixDialer(socketPath), socketRetryEvery)
	if err != nil {
		return nil, fmt.Errorf("connect to the guest's serial port at %s: %w", socketPath, err)
	}
	c, err := newSerialClient(ctx, conn, buildOptions(opts))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("serial port %s: %w", socketPath, err)
	}
	return c, nil
}

// NewSerialClientConn is NewSerialClient on an already connected stream:
// one end of a socketpair whose other end QEMU got as
// -chardev socket,id=agent,fd=N, say. The client owns conn.
func NewSerialClientConn(ctx context.Context, conn net.Conn, opts ...Option) (*SerialClient, error) {
	return newSerialClient(ctx, conn, buildOptions(opts))
}

type unixDialer string

func (p unixDialer) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", string(p))
}

func newSerialClient(ctx context.Context, conn net.Conn, o options) (*SerialClient, error) {
	// ctx ends the handshake by moving the deadline to the past.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	br := bufio.NewReader(conn)
	err := sayHello(conn, br)
	if !stop() {
		return nil, fmt.Errorf("wait for the guest agent: %w", ctx.Err())
	}
	if err != nil {
		return nil, err
	}
	sess, err := yamux.Client(bufferedPort{br, conn, conn}, o.yamuxConfig())
	if err != nil {
		return nil, fmt.Errorf("start yamux: %w", err)
	}
	return &SerialClient{conn: conn, sess: sess}, nil
}

func sayHello(conn net.Conn, br *bufio.Reader) error {
	if _, err := io.WriteString(conn, hostHello); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	if err := skipTo(br, guestHello); err != nil {
		if err == io.EOF {
			return fmt.Errorf("wait for the guest agent: QEMU closed the port (the VM exited?): %w", err)
		}
		return fmt.Errorf("wait for the guest agent: %w", err)
	}
	return nil
}

// Dial opens a new stream to the guest agent. Once the session has ended
// (Close, the VM exited, or keepalive found the guest wedged) the error wraps
// net.ErrClosed.
func (c *SerialClient) Dial(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := c.sess.OpenStream()
	if err != nil {
		if errors.Is(err, yamux.ErrSessionShutdown) || c.sess.IsClosed() {
			return nil, fmt.Errorf("open a stream to the guest agent: %w (%v)", net.ErrClosed, err)
		}
		return nil, fmt.Errorf("open a stream to the guest agent: %w", err)
	}
	return s, nil
}

// Done is closed when the session ends: Close, the VM exited, or the guest
// stopped answering keepalive pings.
func (c *SerialClient) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the session, its streams and the socket connection.
func (c *SerialClient) Close() error {
	c.sess.Close() // closes the connection too
	if err := c.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}
