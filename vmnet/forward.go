package vmnet

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
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
	splice(guest, host)
}

// splice copies bytes both ways until both directions end. An EOF in one
// direction is passed on as a half-close, so the other keeps flowing; an
// error ends both.
func splice(guest *gonet.TCPConn, host net.Conn) {
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(host, guest)
		closeWrite(host)
		done <- err
	}()
	go func() {
		_, err := io.Copy(guest, host)
		guest.CloseWrite()
		done <- err
	}()
	if err := <-done; err != nil {
		guest.Close()
		host.Close()
	}
	<-done
	guest.Close()
	host.Close()
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

// relayUDP relays one flow until it is idle for udpIdleTimeout, either side
// fails, or the network closes.
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

	var last atomic.Int64 // UnixNano of the last datagram either way
	last.Store(time.Now().UnixNano())
	copyDatagrams := func(dst, src net.Conn) {
		buf := make([]byte, 65535)
		for {
			src.SetReadDeadline(time.Now().Add(udpIdleTimeout))
			nr, err := src.Read(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < udpIdleTimeout {
					continue // the other direction is active
				}
				return
			}
			last.Store(time.Now().UnixNano())
			if _, err := dst.Write(buf[:nr]); err != nil {
				return
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyDatagrams(host, guest)
		host.Close()
		guest.Close()
	}()
	copyDatagrams(guest, host)
	guest.Close()
	host.Close()
	<-done
}
