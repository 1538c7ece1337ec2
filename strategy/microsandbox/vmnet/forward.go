package vmnet

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/agentconnect-md/agentconnect/internal/idle"
)

// forwardTCP handles a guest's connection request (a SYN to an address
// that no endpoint of the gateway listens on). gVisor calls it on a
// goroutine of its own. A refused or failed connection is answered with a
// reset, which the guest sees as ECONNREFUSED.
func (n *Network) forwardTCP(r *tcp.ForwarderRequest) {
	if !n.begin() {
		r.Complete(false)
		return
	}
	defer n.wg.Done()

	id := r.ID()
	dst := netip.AddrFrom4(id.LocalAddress.As4())
	port := int(id.LocalPort)
	target, v := n.judge(dst, port)
	if v != nil {
		v.Protocol = "tcp"
		n.logf("vmnet: refused tcp %s:%d: %s", v.Host, port, v.Reason)
		n.violation(*v)
		r.Complete(true)
		return
	}
	if !n.acquire() {
		n.logf("vmnet: tcp %s: too many connections (%d); reset", target, cap(n.slots))
		r.Complete(true)
		return
	}
	defer n.release()

	// Dial before accepting, so that a destination that refuses shows as
	// refused to the guest rather than as a connection that closes at once.
	host, err := n.dial("tcp", target.String())
	if err != nil {
		n.logf("vmnet: tcp %s: %v", target, err)
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, tcpErr := r.CreateEndpoint(&wq)
	r.Complete(false)
	if tcpErr != nil {
		n.logf("vmnet: tcp %s: guest handshake: %s", target, tcpErr)
		host.Close()
		return
	}
	guest := gonet.NewTCPConn(&wq, ep)
	stop := context.AfterFunc(n.ctx, func() {
		guest.Close()
		host.Close()
	})
	defer stop()
	if hosts, in := n.bound(dst, target.Addr(), port); len(hosts) > 0 {
		// The interceptor takes connections with a descriptor, which the
		// guest's (a gVisor endpoint) has not: it gets one end of a socket
		// pair, and the guest's is spliced to the other.
		var err error
		var served <-chan struct{}
		if host, served, err = n.intercept(in, host, hosts, port); err != nil {
			n.logf("vmnet: tcp %s: %v", target, err)
			guest.Close()
			return
		}
		defer func() { <-served }()
	}
	if splice(guest, host, n.tcpIdle) {
		n.logf("vmnet: tcp %s: closed after %v with no bytes either way", target, n.tcpIdle)
	}
}

// intercept hands upstream to in with one end of a socket
// pair for the guest's side, and returns the other end; served is closed
// once the Interceptor returned (it may serve the connection itself) and
// the network's copies are closed.
func (n *Network) intercept(in Interceptor, upstream net.Conn, hosts []string, port int) (_ net.Conn, served <-chan struct{}, _ error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		upstream.Close()
		return nil, nil, fmt.Errorf("a socket pair for the secret injection: %w", err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "intercepted")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				unix.Close(fds[1])
			}
			upstream.Close()
			return nil, nil, fmt.Errorf("a socket pair for the secret injection: %w", err)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		in.Intercept(n.ctx, conns[1], nil, upstream, hosts, port)
		conns[1].Close()
		upstream.Close()
	}()
	return conns[0], done, nil
}

// splice copies bytes both ways until both directions end, or until no byte
// has moved either way for timeout (then it closes both and returns true).
// An EOF in one direction is passed on as a half-close, so the other keeps
// flowing; an error ends both.
func splice(guest *gonet.TCPConn, host net.Conn, timeout time.Duration) (idled bool) {
	w := idle.Start(timeout, guest, host)
	g, h := w.Wrap(guest), w.Wrap(host)
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(h, g)
		closeWrite(h)
		done <- err
	}()
	go func() {
		_, err := io.Copy(g, h)
		closeWrite(g)
		done <- err
	}()
	if err := <-done; err != nil {
		guest.Close()
		host.Close()
	}
	<-done
	guest.Close()
	host.Close()
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

// forwardUDP handles a datagram for which the gateway has no endpoint yet:
// the first of a flow. gVisor calls it on the stack's receive path, so it
// must not block. An allowed flow gets an endpoint (which receives this and
// the next datagrams of the flow) relayed to a host socket; a refused
// datagram is dropped, and reported once per destination.
func (n *Network) forwardUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrFrom4(id.LocalAddress.As4())
	port := int(id.LocalPort)
	target, v := n.judge(dst, port)
	if v != nil {
		if n.reported.first("udp "+netip.AddrPortFrom(dst, uint16(port)).String(), 0) {
			v.Protocol = "udp"
			n.logf("vmnet: refused udp %s:%d: %s", v.Host, port, v.Reason)
			n.violation(*v)
		}
		return
	}
	if !n.acquire() {
		n.logf("vmnet: udp %s: too many flows (%d); dropped", target, cap(n.slots))
		return
	}
	if !n.begin() {
		n.release()
		return
	}
	var wq waiter.Queue
	ep, tcpErr := r.CreateEndpoint(&wq)
	if tcpErr != nil {
		n.logf("vmnet: udp %s: %s", target, tcpErr)
		n.release()
		n.wg.Done()
		return
	}
	guest := gonet.NewUDPConn(&wq, ep)
	go func() {
		defer n.wg.Done()
		defer n.release()
		n.relayUDP(guest, target)
	}()
}

// relayUDP relays one flow until no datagram has passed either way for the
// UDP idle timeout, either side fails, or the network closes.
func (n *Network) relayUDP(guest *gonet.UDPConn, target netip.AddrPort) {
	defer guest.Close()
	host, err := n.dial("udp", target.String())
	if err != nil {
		n.logf("vmnet: udp %s: %v", target, err)
		return
	}
	defer host.Close()
	stop := context.AfterFunc(n.ctx, func() {
		guest.Close()
		host.Close()
	})
	defer stop()

	w := idle.Start(n.udpIdle, guest, host)
	g, h := w.Wrap(guest), w.Wrap(host)
	copyDatagrams := func(dst, src net.Conn) {
		buf := make([]byte, 65535)
		for {
			nr, err := src.Read(buf)
			if err != nil {
				return
			}
			if _, err := dst.Write(buf[:nr]); err != nil {
				return
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyDatagrams(h, g)
		host.Close()
		guest.Close()
	}()
	copyDatagrams(g, h)
	guest.Close()
	host.Close()
	<-done
	w.Stop()
}
