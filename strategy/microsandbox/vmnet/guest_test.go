package vmnet

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// fakeGuest is a second gVisor stack, configured like the VM's guest
// (GuestIP/24, gateway and DNS GatewayIP), whose NIC speaks QEMU's stream
// framing over a socketpair to Network.ServeQEMU.
type fakeGuest struct {
	t        *testing.T
	s        *stack.Stack
	conn     net.Conn // the guest's end
	rxDone   chan struct{}
	serveErr chan error
	once     sync.Once
}

// frameWriter is the guest NIC's transmit side: it writes the framed
// frames the guest's link endpoint sends.
type frameWriter struct {
	mu   sync.Mutex
	conn net.Conn
}

func (w *frameWriter) send(framed []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn.Write(framed)
}

func socketpair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

func newGuest(t *testing.T, n *Network) *fakeGuest {
	t.Helper()
	host, guest := socketpair(t)
	g := &fakeGuest{t: t, conn: guest, rxDone: make(chan struct{}), serveErr: make(chan error, 1)}
	go func() { g.serveErr <- n.ServeQEMU(context.Background(), host) }()

	ep, err := newEndpoint("5a:94:ef:e4:0c:ee", []netip.Addr{guestAddr}, (&frameWriter{conn: guest}).send)
	if err != nil {
		t.Fatal(err)
	}
	g.s = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := g.s.CreateNIC(1, ep); err != nil {
		t.Fatal(err)
	}
	if err := g.s.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(guestAddr.As4()), PrefixLen: 24},
	}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{192, 168, 127, 0}), tcpip.MaskFromBytes([]byte{255, 255, 255, 0}))
	g.s.SetRouteTable([]tcpip.Route{
		{Destination: sub, NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(gatewayAddr.As4()), NIC: 1},
	})

	go func() { // the guest NIC's receive side
		defer close(g.rxDone)
		br := bufio.NewReader(guest)
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(br, hdr[:]); err != nil {
				return
			}
			frame := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(br, frame); err != nil {
				return
			}
			if len(frame) >= header.EthernetMinimumSize {
				ep.deliver(header.Ethernet(frame).Type(), frame[header.EthernetMinimumSize:])
			}
		}
	}()
	t.Cleanup(g.close)
	return g
}

// close unplugs the guest and waits for its goroutines.
func (g *fakeGuest) close() {
	g.once.Do(func() {
		g.conn.Close()
		<-g.rxDone
		g.s.Destroy()
	})
}

func fullAddr(ip string, port int) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(netip.MustParseAddr(ip).As4()), Port: uint16(port)}
}

func (g *fakeGuest) dialTCP(ip string, port int) (*gonet.TCPConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return gonet.DialContextTCP(ctx, g.s, fullAddr(ip, port), ipv4.ProtocolNumber)
}

func (g *fakeGuest) dialUDP(ip string, port int) *gonet.UDPConn {
	g.t.Helper()
	raddr := fullAddr(ip, port)
	c, err := gonet.DialUDP(g.s, nil, &raddr, ipv4.ProtocolNumber)
	if err != nil {
		g.t.Fatal(err)
	}
	return c
}

func dnsQuery(t *testing.T, name string, qtype dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x1234, RecursionDesired: true})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: qtype, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func parseDNSReply(t *testing.T, msg []byte) (dnsmessage.RCode, []netip.Addr) {
	t.Helper()
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Response || h.ID != 0x1234 {
		t.Fatalf("reply header %+v", h)
	}
	if err := p.SkipAllQuestions(); err != nil {
		t.Fatal(err)
	}
	var addrs []netip.Addr
	for {
		ah, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ah.Type != dnsmessage.TypeA {
			p.SkipAnswer()
			continue
		}
		a, err := p.AResource()
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, netip.AddrFrom4(a.A))
	}
	return h.RCode, addrs
}

// resolve asks the gateway's DNS over UDP.
func (g *fakeGuest) resolve(name string, qtype dnsmessage.Type) (dnsmessage.RCode, []netip.Addr) {
	g.t.Helper()
	c := g.dialUDP(GatewayIP, 53)
	defer c.Close()
	if _, err := c.Write(dnsQuery(g.t, name, qtype)); err != nil {
		g.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2048)
	nr, err := c.Read(buf)
	if err != nil {
		g.t.Fatalf("dns %s: %v", name, err)
	}
	return parseDNSReply(g.t, buf[:nr])
}

// resolveTCP asks the gateway's DNS over TCP.
func (g *fakeGuest) resolveTCP(name string, qtype dnsmessage.Type) (dnsmessage.RCode, []netip.Addr) {
	g.t.Helper()
	c, err := g.dialTCP(GatewayIP, 53)
	if err != nil {
		g.t.Fatal(err)
	}
	defer c.Close()
	q := dnsQuery(g.t, name, qtype)
	out := binary.BigEndian.AppendUint16(nil, uint16(len(q)))
	if _, err := c.Write(append(out, q...)); err != nil {
		g.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		g.t.Fatal(err)
	}
	msg := make([]byte, binary.BigEndian.Uint16(hdr[:]))
	if _, err := io.ReadFull(c, msg); err != nil {
		g.t.Fatal(err)
	}
	return parseDNSReply(g.t, msg)
}
