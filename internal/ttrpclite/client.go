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

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// ErrClosed is returned by the calls of a client whose connection is closed
// or broken; its text is the ttrpc library's.
var ErrClosed = errors.New("ttrpc: closed")

// Client makes unary ttrpc calls on one connection; calls may run
// concurrently, each on a stream of its own.
type Client struct {
	conn net.Conn

	writeMu sync.Mutex // one frame on the wire at a time

	mu      sync.Mutex // guards the fields below
	next    uint32     // the next stream id: odd, increasing
	calls   map[uint32]chan response
	closed  chan struct{}
	closeMu sync.Once
	err     error // why it closed
}

// NewClient makes calls on conn; Close closes conn.
func NewClient(conn net.Conn) *Client {
	c := &Client{conn: conn, next: 1, calls: map[uint32]chan response{}, closed: make(chan struct{})}
	go c.receive()
	return c
}

// Close closes the connection; calls in flight return ErrClosed.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

func (c *Client) fail(err error) {
	c.closeMu.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		c.conn.Close()
		close(c.closed)
	})
}

// Call calls service's method with the encoded request and returns the
// encoded response. An error the server returned is of its errdefs kind,
// with the server's message as its text.
func (c *Client) Call(ctx context.Context, service, method string, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := request{service: service, method: method, payload: req}
	if d, ok := ctx.Deadline(); ok {
		// A deadline can pass before its context says so (its timer has
		// not run yet); the write would fail at once.
		left := time.Until(d)
		if left <= 0 {
			return nil, context.DeadlineExceeded
		}
		// As the library does: the server ends the call at the deadline too.
		r.timeoutNano = left.Nanoseconds()
	}
	data := r.marshal()
	if len(data) > MaxMessage {
		return nil, errdefs.ResourceExhausted("%s/%s: a request of %d bytes is over ttrpc's %d-byte limit", service, method, len(data), MaxMessage)
	}

	reply := make(chan response, 1)
	id, err := c.send(ctx, data, reply)
	if err != nil {
		return nil, err
	}
	defer func() {
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
	}()
	select {
	case resp := <-reply:
		if err := errdefs.FromCode(resp.code, resp.message); err != nil {
			return nil, err
		}
		return resp.payload, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, ErrClosed
	}
}

// send registers a call and writes its request frame whole, by ctx's
// deadline. Stream ids go on the wire in the order they are taken, as the
// server requires. A frame cut short leaves the stream unreadable: the
// connection is closed then; one not begun leaves it as it was.
func (c *Client) send(ctx context.Context, data []byte, reply chan response) (uint32, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return 0, ErrClosed
	}
	id := c.next
	c.next += 2
	c.calls[id] = reply
	c.mu.Unlock()

	d, _ := ctx.Deadline()
	c.conn.SetWriteDeadline(d)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.conn.SetWriteDeadline(time.Now())
		close(fired)
	})
	n, err := c.conn.Write(appendFrame(nil, id, typeRequest, data))
	if !stop() {
		<-fired // its deadline must not cut the next call's write
	}
	if err == nil {
		return id, nil
	}
	c.mu.Lock()
	delete(c.calls, id)
	c.mu.Unlock()
	// A stream id not sent is not used: the server only requires the ids
	// it sees to increase.
	timedOut := errors.Is(err, os.ErrDeadlineExceeded)
	if n > 0 || !timedOut {
		c.fail(err)
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if timedOut {
		return 0, context.DeadlineExceeded
	}
	return 0, ErrClosed
}

// receive delivers each response to its call until the connection ends.
func (c *Client) receive() {
	br := bufio.NewReader(c.conn)
	var hbuf [headerLength]byte
	for {
		h, err := readHeader(br, &hbuf)
		if err != nil {
			c.fail(err)
			return
		}
		if h.length > MaxMessage {
			c.fail(fmt.Errorf("a frame of %d bytes is over ttrpc's %d-byte limit", h.length, MaxMessage))
			return
		}
		data := make([]byte, h.length)
		if _, err := io.ReadFull(br, data); err != nil {
			c.fail(err)
			return
		}
		if h.typ != typeResponse {
			continue // data frames belong to streams, which no call here opens
		}
		var resp response
		if err := resp.unmarshal(data); err != nil {
			resp = response{code: errdefs.CodeUnknown, message: fmt.Sprintf("ttrpc response: %v", err)}
		}
		c.mu.Lock()
		reply := c.calls[h.streamID]
		c.mu.Unlock()
		select {
		case reply <- resp: // buffered: a call that gave up does not block this
		default: // no such call, or a second response to it
		}
	}
}
