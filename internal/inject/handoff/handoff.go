// Package handoff carries a session's intercepted tunnels from its shim's
// proxy to its agentconnect-inject process: each tunnel is one message on
// a unix SOCK_SEQPACKET socket, its two connections' file descriptors
// attached (SCM_RIGHTS), so that the inject process serves connections the
// proxy allowed and dialled, and needs no network of its own. The package
// links neither net/http nor crypto/tls: the shim imports it.
package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Config is what the shim writes on the inject process's stdin.
type Config struct {
	Secrets []Secret `json:"secrets"`
	// RootCAsPEM, if set, verify the hosts besides the system's store.
	RootCAsPEM string `json:"rootCAsPEM,omitempty"`
}

// Secret is one binding, as package inject takes it.
type Secret struct {
	Placeholder string   `json:"placeholder"`
	Value       string   `json:"value"`
	Hosts       []string `json:"hosts"`
	Headers     []string `json:"headers"`
	TokenHosts  []string `json:"tokenHosts,omitempty"`
	TokenField  string   `json:"tokenField,omitempty"`
}

// Update is the inject process's message to the shim: a secret's value
// renewed by its token endpoint.
type Update struct {
	Placeholder string `json:"placeholder"`
	Value       string `json:"value"`
}

// Ready is the inject process's one line on stdout: its session CA.
type Ready struct {
	CACertPEM string `json:"caCertPEM"`
}

// Tunnel is one message: where the tunnel goes (the names the session may
// have meant by its address, and its port) and what the proxy read of the
// client already.
type Tunnel struct {
	Hosts    []string `json:"hosts"`
	Port     int      `json:"port"`
	Buffered []byte   `json:"buffered,omitempty"`
}

// maxMessage bounds a message: the header and the proxy's read buffer.
const maxMessage = 16 << 10

// Pair is a connected socket pair: Sender's end stays in the shim, the
// other file goes to the inject process (as its fd 3).
func Pair() (*Sender, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("handoff socket: %w", err)
	}
	return &Sender{fd: fds[0]}, os.NewFile(uintptr(fds[1]), "handoff"), nil
}

// Sender is the shim's end.
type Sender struct {
	mu       sync.Mutex
	fd       int
	closed   bool // no more sends
	reading  bool // ReadUpdates runs: it closes fd when it ends
	fdClosed bool
}

// Send hands a tunnel over; the caller closes its own client and upstream
// afterwards (the inject process has its copies).
func (s *Sender) Send(t Tunnel, client, upstream net.Conn) error {
	head, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if len(head) > maxMessage {
		return fmt.Errorf("handoff: a tunnel header of %d bytes", len(head))
	}
	var fds []int
	for _, c := range []net.Conn{client, upstream} {
		f, err := fileOf(c)
		if err != nil {
			return err
		}
		defer f.Close()
		fds = append(fds, int(f.Fd()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("handoff: closed")
	}
	if err := unix.Sendmsg(s.fd, head, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("handoff: %w", err)
	}
	return nil
}

// Close closes the shim's end: the inject process sees its end and exits.
func (s *Sender) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	// Shutdown wakes ReadUpdates, which then closes the descriptor: a
	// close under a blocked read would let the number be reused under it.
	unix.Shutdown(s.fd, unix.SHUT_RDWR)
	return s.closeFD()
}

func (s *Sender) closeFD() error {
	if s.reading || s.fdClosed {
		return nil
	}
	s.fdClosed = true
	return unix.Close(s.fd)
}

// ReadUpdates calls fn with each update the inject process sends, until
// either end closes. Run it on a goroutine of its own, once.
func (s *Sender) ReadUpdates(fn func(Update)) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.reading = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.closed, s.reading = true, false
		s.closeFD()
		s.mu.Unlock()
	}()
	buf := make([]byte, maxMessage)
	for {
		n, _, _, _, err := unix.Recvmsg(s.fd, buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return
		}
		var u Update
		if json.Unmarshal(buf[:n], &u) == nil && u.Placeholder != "" {
			fn(u)
		}
	}
}

// SendUpdate sends an update on the inject process's end (fd).
func SendUpdate(fd int, u Update) error {
	msg, err := json.Marshal(u)
	if err != nil {
		return err
	}
	if len(msg) > maxMessage {
		return fmt.Errorf("handoff: an update of %d bytes", len(msg))
	}
	return unix.Sendmsg(fd, msg, nil, nil, 0)
}

// fileOf is a duplicate of c's descriptor.
func fileOf(c net.Conn) (*os.File, error) {
	fc, ok := c.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("handoff: a %T has no file descriptor", c)
	}
	return fc.File()
}

// Receive reads the next tunnel from the inject process's end (fd): its
// header and its two connections. io.EOF-like end: ErrClosed.
func Receive(fd int) (Tunnel, net.Conn, net.Conn, error) {
	buf := make([]byte, maxMessage)
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	for errors.Is(err, unix.EINTR) {
		n, oobn, _, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	}
	if err != nil {
		return Tunnel{}, nil, nil, fmt.Errorf("handoff: %w", err)
	}
	if n == 0 && oobn == 0 {
		return Tunnel{}, nil, nil, ErrClosed
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	var conns []net.Conn
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "tunnel")
		c, err := net.FileConn(f)
		f.Close()
		if err == nil {
			conns = append(conns, c)
		}
	}
	var t Tunnel
	if err := json.Unmarshal(buf[:n], &t); err != nil || len(conns) != 2 {
		for _, c := range conns {
			c.Close()
		}
		return Tunnel{}, nil, nil, fmt.Errorf("handoff: a message that is not a tunnel (%d connections)", len(conns))
	}
	return t, conns[0], conns[1], nil
}

// ErrClosed is Receive's answer once the shim's end is closed.
var ErrClosed = errors.New("handoff: the shim closed its end")
