// Package vmnet is the user-mode network behind a microVM's NIC.
//
// Each VM gets its own Network: a virtual Ethernet segment on which a gVisor
// network stack plays the gateway. QEMU's NIC is attached with ServeQEMU
// (QEMU's stream netdev protocol). The gateway answers ARP, serves DNS on
// GatewayIP:53 and forwards the guest's TCP connections and UDP flows to the
// outside, each one judged first by a netpolicy.Policy, the same engine the
// srt strategy's proxy uses. Everything else (ICMP, IPv6, other protocols)
// is dropped.
//
// A destination is judged as every identity the guest may have meant: each
// name that this Network's DNS resolved to the address, and the address
// itself. It is allowed if one of them passes both Policy.CheckName and
// Policy.CheckAddr for the address actually dialled. HostIP is dialled as
// 127.0.0.1, the host's loopback, which the policy refuses unless an allowed
// entry names it with its port ("127.0.0.1:8080", or "HostName:8080" once
// the guest resolved HostName). Allowed connections are dialled at the
// checked address, never at a name, so DNS cannot rebind between the check
// and the dial.
//
// DNS: names are checked before anything is asked upstream. A name that no
// port of the policy could allow gets NXDOMAIN and a "dns" violation, so a
// guest with an allowlist cannot tunnel data through lookups of other names.
// A queries are answered from Config.Resolver, with the upstream answer's
// TTL within bounds; a name's addresses are judged by the name until that
// TTL runs out. The VM network is IPv4 only,
// so AAAA (and every other type) gets an empty answer without an upstream
// lookup. HostName resolves to HostIP.
package vmnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// The addresses of every VM network. Each VM has a network of its own, so
// they never collide.
const (
	Subnet    = "192.168.127.0/24"
	GatewayIP = "192.168.127.1" // the gateway, also the DNS server
	GuestIP   = "192.168.127.2" // the guest, configured statically
	HostIP    = "192.168.127.254"
	// HostName resolves to HostIP, which stands for the host's loopback.
	HostName = netpolicy.HostName
)

// MTU is the NIC's MTU; the guest should use the same.
const MTU = 1500

const (
	gatewayMAC = "5a:94:ef:e4:0c:dd"
	nicID      = 1

	// defaultMaxConns bounds the forwarded TCP connections plus UDP flows
	// of one VM.
	defaultMaxConns = 256
	// maxHandshakes bounds TCP connection requests waiting for a decision
	// and a dial.
	maxHandshakes = 64
	// dialTimeout bounds one dial.
	dialTimeout = 10 * time.Second
	// defaultTCPIdleTimeout closes a forwarded TCP connection through which
	// no byte has moved either way for that long, so that the guest cannot
	// hold connections (and slots) forever; the same as the srt proxy's, and
	// above what NAT gateways allow an idle connection.
	defaultTCPIdleTimeout = 10 * time.Minute
	// defaultUDPIdleTimeout ends a UDP flow with no datagram either way:
	// there is no close to end it otherwise. Like a NAT's UDP timeout
	// (Linux conntrack: 30 s unreplied, 120 s assured).
	defaultUDPIdleTimeout = 60 * time.Second
	// txQueueLen is how many frames may wait for QEMU; more are dropped,
	// as a real NIC would.
	txQueueLen = 512
	// txTimeout is how long QEMU may refuse to read before it is cut off.
	txTimeout = 30 * time.Second
)

var (
	subnet      = netip.MustParsePrefix(Subnet)
	gatewayAddr = netip.MustParseAddr(GatewayIP)
	guestAddr   = netip.MustParseAddr(GuestIP)
	hostAddr    = netip.MustParseAddr(HostIP)
	loopback    = netip.MustParseAddr("127.0.0.1")
)

// Resolver resolves names for the guest; *net.Resolver satisfies it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Config configures a Network. Only Policy matters for security; the rest
// has working defaults.
type Config struct {
	// Policy judges every destination; nil is the empty policy (any name,
	// public addresses only).
	Policy *netpolicy.Policy
	// Resolver answers the guest's DNS queries; nil means
	// net.DefaultResolver. A *net.Resolver is asked through Go's own DNS
	// client, so that the TTL of each answer is seen: the guest is told it
	// (within 10 s and 1 h) and the answer's addresses stand for the name
	// that long. Other resolvers' answers last 60 s.
	Resolver Resolver
	// Dial connects to a checked "ip:port" ("tcp" or "udp"); nil means a
	// net.Dialer. Each call gets a context that ends after 10 s.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnViolation, if set, is called for refusals: every refused TCP
	// connection, the first refused datagram to each UDP destination, and
	// refused names (at most once per name in 10 s). It is called from the
	// network's goroutines and should return quickly.
	OnViolation func(netpolicy.Violation)
	// Logf, if set, receives one line per refusal or failure.
	Logf func(format string, args ...any)
	// MaxConns bounds the TCP connections and UDP flows forwarded at once;
	// 0 means 256. Beyond it new connections are reset and datagrams
	// dropped.
	MaxConns int
	// TCPIdleTimeout closes a forwarded TCP connection with no byte either
	// way for that long; 0 means 10 min.
	TCPIdleTimeout time.Duration
	// UDPIdleTimeout ends a UDP flow with no datagram either way for that
	// long, which frees its slot; 0 means 60 s.
	UDPIdleTimeout time.Duration
}

// Interceptor serves connections to the hosts it binds.
type Interceptor interface {
	Binds(host string, port int) bool
	// Intercept serves one connection to port of the address hosts (the
	// bound names the guest may have meant by it) lead to. client is the
	// guest's side, as a connection with a file descriptor; upstream is
	// dialled. It returns when the connection is served or handed on; the
	// network closes its copies of both then.
	Intercept(ctx context.Context, client net.Conn, buffered []byte, upstream net.Conn, hosts []string, port int)
}

type interceptorRef struct{ Interceptor }

// Network is one VM's network. Its methods are safe for concurrent use.
type Network struct {
	cfg      Config
	resolver Resolver
	tcpIdle  time.Duration
	udpIdle  time.Duration
	stack    *stack.Stack
	link     *endpoint
	port     *port
	names    *nameCache
	reported *reportCache

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	slots  chan struct{} // one per forwarded connection or flow
	dnsSem chan struct{} // one per DNS query being answered or DNS TCP connection

	dnsUDP *gonet.UDPConn
	dnsTCP *gonet.TCPListener

	// interceptor, once set (SetInterceptor), serves the allowed TCP
	// connections to the hosts it binds.
	interceptor atomic.Pointer[interceptorRef]

	mu     sync.Mutex // guards the fields that follow and wg.Add
	closed bool
	guest  net.Conn // the connection ServeQEMU serves, if any
	wg     sync.WaitGroup
}

// New builds a network with its gateway and DNS server; attach the VM with
// ServeQEMU. Close it when the VM is gone.
func New(cfg Config) (*Network, error) {
	n := &Network{
		cfg:      cfg,
		resolver: cfg.Resolver,
		names:    newNameCache(maxNamedAddrs, maxNamesPerAddr),
		reported: newReportCache(maxReported),
		dnsSem:   make(chan struct{}, maxDNSInFlight),
	}
	if n.resolver == nil {
		n.resolver = net.DefaultResolver
	}
	maxConns := cfg.MaxConns
	if maxConns <= 0 {
		maxConns = defaultMaxConns
	}
	n.slots = make(chan struct{}, maxConns)
	n.tcpIdle, n.udpIdle = cfg.TCPIdleTimeout, cfg.UDPIdleTimeout
	if n.tcpIdle <= 0 {
		n.tcpIdle = defaultTCPIdleTimeout
	}
	if n.udpIdle <= 0 {
		n.udpIdle = defaultUDPIdleTimeout
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())

	n.port = &port{n: n}
	link, err := newEndpoint(gatewayMAC, []netip.Addr{gatewayAddr, hostAddr}, n.port.send)
	if err != nil {
		n.cancel()
		return nil, err
	}
	n.link = link

	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	n.stack = s
	if err := n.setupStack(); err != nil {
		n.cancel()
		s.Destroy()
		return nil, err
	}
	if err := n.startDNS(); err != nil {
		n.cancel()
		s.Destroy()
		return nil, err
	}
	return n, nil
}

func (n *Network) setupStack() error {
	s := n.stack
	sack := tcpip.TCPSACKEnabled(true)
	if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack); err != nil {
		return fmt.Errorf("tcp options: %s", err)
	}
	if err := s.CreateNIC(nicID, n.link); err != nil {
		return fmt.Errorf("create NIC: %s", err)
	}
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFrom4(gatewayAddr.As4()).WithPrefix(),
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("gateway address: %s", err)
	}
	// Spoofing and promiscuous mode let the gateway accept connections to
	// any address and answer from it: that is what forwarding needs. The
	// link endpoint drops ARP replies for any address but GatewayIP and
	// HostIP, so the guest cannot be told that other subnet addresses exist.
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("spoofing: %s", err)
	}
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("promiscuous mode: %s", err)
	}
	sub, err := tcpip.NewSubnet(tcpip.AddrFrom4(subnet.Addr().As4()), tcpip.MaskFromBytes(net.CIDRMask(subnet.Bits(), 32)))
	if err != nil {
		return fmt.Errorf("subnet: %v", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: sub, NIC: nicID}})

	tcpFwd := tcp.NewForwarder(s, 0, maxHandshakes, n.forwardTCP)
	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(s, n.forwardUDP)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	return nil
}

// ErrBusy is returned by ServeQEMU when the network already serves a VM.
var ErrBusy = errors.New("vmnet: the network already serves a connection")

// ServeQEMU attaches a VM's NIC: conn carries QEMU's stream netdev protocol
// (each Ethernet frame preceded by its length, 4 bytes big-endian), as from
// `-netdev stream,server=off,addr.type=unix,addr.path=SOCK` or one end of a
// socketpair. It serves until conn fails or ends (then it returns nil on a
// clean EOF), ctx ends, or the network is closed (then nil), and closes
// conn. A network serves one connection at a time: a second concurrent call
// returns ErrBusy.
func (n *Network) ServeQEMU(ctx context.Context, conn net.Conn) error {
	n.mu.Lock()
	switch {
	case n.closed:
		n.mu.Unlock()
		conn.Close()
		return net.ErrClosed
	case n.guest != nil:
		n.mu.Unlock()
		conn.Close()
		return ErrBusy
	}
	n.guest = conn
	n.wg.Add(1)
	n.mu.Unlock()
	defer n.wg.Done()

	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	err := n.port.serve(conn)
	conn.Close()

	n.mu.Lock()
	n.guest = nil
	closed := n.closed
	n.mu.Unlock()
	if closed || ctx.Err() != nil {
		return nil
	}
	return err
}

// Close stops the network: it detaches the VM, ends every forwarded
// connection and the DNS server, and returns when all of the network's
// goroutines have ended.
// SetInterceptor makes in serve the allowed TCP connections to the hosts
// it binds (the hosts of the session's secrets) from then on; every other
// connection is relayed untouched. A warm VM's network runs before its
// session, whose secrets come with the claim; the guest's runtime starts
// after this.
func (n *Network) SetInterceptor(in Interceptor) {
	n.interceptor.Store(&interceptorRef{in})
}

func (n *Network) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	guest := n.guest
	n.mu.Unlock()

	n.cancel() // ends relays and pending dials and lookups
	if guest != nil {
		guest.Close()
	}
	n.dnsUDP.Close()
	n.dnsTCP.Close()
	n.stack.Close() // aborts every endpoint, the guest side of every relay
	n.wg.Wait()
	n.stack.Wait()
	return nil
}

// begin registers a goroutine of the network; it returns false once the
// network is closed.
func (n *Network) begin() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.wg.Add(1)
	return true
}

// acquire takes a connection slot without waiting.
func (n *Network) acquire() bool {
	select {
	case n.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (n *Network) release() { <-n.slots }

func (n *Network) dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(n.ctx, dialTimeout)
	defer cancel()
	if n.cfg.Dial != nil {
		return n.cfg.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (n *Network) logf(format string, args ...any) {
	if n.cfg.Logf != nil {
		n.cfg.Logf(format, args...)
	}
}

func (n *Network) violation(v netpolicy.Violation) {
	v.Time = time.Now()
	if n.cfg.OnViolation != nil {
		n.cfg.OnViolation(v)
	}
}

// DialGuest connects from the gateway to port on the guest's address, for a
// session forward: the guest's server must listen on that address (or on
// every address), as behind any NAT. It fails once the network is closed.
func (n *Network) DialGuest(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: want 1 to 65535", port)
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	stop := context.AfterFunc(n.ctx, cancel)
	defer stop()
	c, err := gonet.DialContextTCP(ctx, n.stack, tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(guestAddr.As4()), Port: uint16(port)}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("connect to the guest's port %d: %w", port, err)
	}
	return c, nil
}
