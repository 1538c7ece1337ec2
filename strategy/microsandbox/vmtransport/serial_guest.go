package vmtransport

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// SerialPortName is the name the host gives the agent's port:
// -device virtserialport,chardev=...,name=agentconnect.
const SerialPortName = "agentconnect"

// FindSerialPort returns the device of the virtio-serial port called name,
// such as /dev/vport1p1: without udev there is no /dev/virtio-ports/NAME, so
// it reads /sys/class/virtio-ports/*/name. The port's name reaches the guest
// after the port itself, so a caller at boot retries for a while.
func FindSerialPort(name string) (string, error) {
	return findSerialPort("/sys/class/virtio-ports", "/dev", name)
}

func findSerialPort(sysDir, devDir, name string) (string, error) {
	entries, err := os.ReadDir(sysDir)
	if err != nil {
		return "", fmt.Errorf("find virtio-serial port %q: %w (is virtio_console loaded?)", name, err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(sysDir, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		dev := filepath.Join(devDir, e.Name())
		if _, err := os.Stat(dev); err != nil {
			return "", fmt.Errorf("find virtio-serial port %q: %w", name, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("find virtio-serial port %q: no port of that name in %s (%d ports)", name, sysDir, len(entries))
}

// ListenSerial serves the guest side of the serial transport on the
// virtio-serial device at path: Accept returns the streams the host opens.
// When the host goes away (the shim restarts), the listener reopens the
// port, waits for the host to come back and starts a new session; streams of
// the old session fail. Close stops it.
func ListenSerial(path string, opts ...Option) (net.Listener, error) {
	// Open once here so that a wrong path is an error now, not a log line.
	f, err := openPort(path)
	if err != nil {
		return nil, err
	}
	first := f
	open := func() (io.ReadWriteCloser, error) {
		if first != nil {
			p := first
			first = nil
			return p, nil
		}
		return openPort(path)
	}
	return newSerialListener(path, open, buildOptions(opts)), nil
}

// ListenSerialConn serves the guest side of the serial transport on port, an
// already open byte stream, for one session: when the host goes away the
// listener closes. It is ListenSerial without the device.
func ListenSerialConn(port io.ReadWriteCloser, opts ...Option) net.Listener {
	first := port
	open := func() (io.ReadWriteCloser, error) {
		if first == nil {
			return nil, errNoMorePorts
		}
		p := first
		first = nil
		return p, nil
	}
	return newSerialListener("conn", open, buildOptions(opts))
}

// errNoMorePorts ends a listener whose port cannot be reopened.
var errNoMorePorts = errors.New("the port cannot be reopened")

// openRetries bounds the retries of an open that fails with EBUSY: the port
// admits one opener, and the previous session's file may still be closing.
const (
	openRetries    = 50
	openRetryDelay = 20 * time.Millisecond
)

func openPort(path string) (*devicePort, error) {
	for i := 0; ; i++ {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			return &devicePort{f}, nil
		}
		if !errors.Is(err, unix.EBUSY) || i == openRetries {
			return nil, fmt.Errorf("open virtio-serial port: %w", err)
		}
		time.Sleep(openRetryDelay)
	}
}

// devicePort is a virtio-serial port's character device. Go polls it like a
// socket: reads and writes wait in the runtime and Close interrupts them.
type devicePort struct{ *os.File }

// waitHost returns once the host side is connected. While it is not, a read
// returns end-of-file at once and a write would block; the port reports
// POLLHUP and not POLLOUT, and wakes its pollers when the host connects.
func (p *devicePort) waitHost() error {
	rc, err := p.SyscallConn()
	if err != nil {
		return err
	}
	var perr error
	err = rc.Write(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		for {
			_, err := unix.Poll(fds, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				perr = err
				return true
			}
			return fds[0].Revents&unix.POLLOUT != 0
		}
	})
	if err != nil {
		return err
	}
	if perr != nil {
		return fmt.Errorf("poll: %w", perr)
	}
	return nil
}

// hostWaiter is a port that can tell when the host side is connected.
type hostWaiter interface{ waitHost() error }

// serialListener runs one yamux server session at a time on a port, and a
// new one whenever the last ends.
type serialListener struct {
	name  string
	open  func() (io.ReadWriteCloser, error)
	opts  options
	conns chan net.Conn
	done  chan struct{}

	// mu guards the fields that follow.
	mu     sync.Mutex
	closed bool
	port   io.ReadWriteCloser // the current session's, closed by Close
}

func newSerialListener(name string, open func() (io.ReadWriteCloser, error), o options) *serialListener {
	l := &serialListener{
		name:  name,
		open:  open,
		opts:  o,
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
	}
	go l.run()
	return l
}

// Pacing between sessions: a broken port costs a log line a second instead
// of a busy loop, and a host that connects and leaves at once a short pause.
const (
	reopenDelay  = time.Second
	hostGoneWait = 100 * time.Millisecond
)

// errHostGone is a session that ended before the host said hello: the host
// disconnected, which is not worth a log line.
var errHostGone = errors.New("the host disconnected before its hello")

func (l *serialListener) run() {
	for {
		port, err := l.open()
		if err == nil {
			if !l.setPort(port) {
				port.Close()
				return
			}
			err = l.serveSession(port)
			port.Close()
			l.setPort(nil)
		}
		if l.isClosed() {
			return
		}
		if errors.Is(err, errNoMorePorts) {
			l.Close()
			return
		}
		pause := time.Duration(0)
		switch {
		case err == nil:
		case errors.Is(err, errHostGone):
			pause = hostGoneWait
		default:
			l.opts.logf("vmtransport: serial port %s: %v", l.name, err)
			pause = reopenDelay
		}
		if pause > 0 {
			select {
			case <-time.After(pause):
			case <-l.done:
				return
			}
		}
	}
}

func (l *serialListener) setPort(p io.ReadWriteCloser) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.port = p
	return true
}

func (l *serialListener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// serveSession waits for the host, exchanges hellos and hands the session's
// streams to Accept until the session ends.
func (l *serialListener) serveSession(port io.ReadWriteCloser) error {
	if w, ok := port.(hostWaiter); ok {
		if err := w.waitHost(); err != nil {
			return fmt.Errorf("wait for the host: %w", err)
		}
	}
	br := bufio.NewReader(port)
	if err := skipTo(br, hostHello); err != nil {
		if err == io.EOF {
			return errHostGone
		}
		return fmt.Errorf("wait for the host's hello: %w", err)
	}
	if _, err := io.WriteString(port, guestHello); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	sess, err := yamux.Server(bufferedPort{br, port, port}, l.opts.yamuxConfig())
	if err != nil {
		return fmt.Errorf("start yamux: %w", err)
	}
	defer sess.Close()
	for {
		stream, err := sess.Accept()
		if err != nil {
			if err == io.EOF || errors.Is(err, yamux.ErrSessionShutdown) {
				return nil // the host went away, or Close
			}
			return fmt.Errorf("session ended: %w", err)
		}
		select {
		case l.conns <- stream:
		case <-l.done:
			stream.Close()
			return nil
		}
	}
}

// Accept returns the next stream the host opened.
func (l *serialListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, and ends the current session and its streams.
func (l *serialListener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	close(l.done)
	if l.port != nil {
		l.port.Close()
	}
	return nil
}

// Addr names the port.
func (l *serialListener) Addr() net.Addr { return serialAddr(l.name) }

type serialAddr string

func (a serialAddr) Network() string { return "virtio-serial" }
func (a serialAddr) String() string  { return string(a) }
