package vmnet

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

const (
	// maxDNSInFlight bounds the DNS queries being answered plus the DNS
	// TCP connections; UDP queries beyond it are dropped (the guest
	// retries), TCP connections closed.
	maxDNSInFlight = 64
	// resolveTimeout bounds one upstream lookup.
	resolveTimeout = 5 * time.Second
	// dnsTCPIdle closes a DNS TCP connection with no query.
	dnsTCPIdle = 10 * time.Second
	// maxAnswers bounds the A records of one answer, which keeps every
	// answer within 512 bytes: 12 (header) + 259 (longest question) + 12 *
	// 16 (compressed A record).
	maxAnswers = 12
	// minNameTTL and maxNameTTL bound the TTL of an answer: the guest is
	// told it, and the addresses stand for the name (for judging the
	// guest's connections) that long, plus nameGrace. The floor lets a
	// guest connect after an answer with TTL 0 (such answers are common
	// from load balancers); the cap keeps a name from pinning an address
	// that may have passed to someone else for long.
	minNameTTL = 10 * time.Second
	maxNameTTL = time.Hour
	// defaultNameTTL is the TTL of an answer whose own could not be seen:
	// one from the host's /etc/hosts, or from a Resolver that is not a
	// *net.Resolver.
	defaultNameTTL = time.Minute
	// nameGrace keeps a name's addresses a little longer than the guest
	// was told, so that a guest that connects just as its own cache
	// expires is still judged by the name.
	nameGrace = 5 * time.Second
)

// startDNS serves DNS on GatewayIP:53, UDP and TCP.
func (n *Network) startDNS() error {
	addr := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(gatewayAddr.As4()), Port: 53}
	uc, err := gonet.DialUDP(n.stack, &addr, nil, ipv4.ProtocolNumber)
	if err != nil {
		return err
	}
	ln, err := gonet.ListenTCP(n.stack, addr, ipv4.ProtocolNumber)
	if err != nil {
		uc.Close()
		return err
	}
	n.dnsUDP, n.dnsTCP = uc, ln
	n.wg.Add(2)
	go func() {
		defer n.wg.Done()
		n.serveDNSUDP()
	}()
	go func() {
		defer n.wg.Done()
		n.serveDNSTCP()
	}()
	return nil
}

func (n *Network) serveDNSUDP() {
	buf := make([]byte, 65535)
	for {
		nr, from, err := n.dnsUDP.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		select {
		case n.dnsSem <- struct{}{}:
		default:
			continue // busy: drop, the guest retries
		}
		if !n.begin() {
			<-n.dnsSem
			return
		}
		query := append([]byte(nil), buf[:nr]...)
		go func() {
			defer n.wg.Done()
			defer func() { <-n.dnsSem }()
			if resp := n.answerDNS(query); resp != nil {
				n.dnsUDP.WriteTo(resp, from)
			}
		}()
	}
}

func (n *Network) serveDNSTCP() {
	for {
		c, err := n.dnsTCP.Accept()
		if err != nil {
			return // closed
		}
		select {
		case n.dnsSem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		if !n.begin() {
			<-n.dnsSem
			c.Close()
			return
		}
		go func() {
			defer n.wg.Done()
			defer func() { <-n.dnsSem }()
			stop := context.AfterFunc(n.ctx, func() { c.Close() })
			defer stop()
			defer c.Close()
			n.serveDNSConn(c)
		}()
	}
}

// serveDNSConn answers length-prefixed queries on a DNS TCP connection.
func (n *Network) serveDNSConn(c net.Conn) {
	var hdr [2]byte
	buf := make([]byte, 65535)
	for {
		c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		query := buf[:binary.BigEndian.Uint16(hdr[:])]
		if _, err := io.ReadFull(c, query); err != nil {
			return
		}
		resp := n.answerDNS(query)
		if resp == nil {
			return
		}
		out := make([]byte, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		copy(out[2:], resp)
		c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// answerDNS answers one query, or returns nil for a message that is not a
// query.
func (n *Network) answerDNS(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	resp := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		resp.RCode = dnsmessage.RCodeFormatError
		return buildDNS(resp, nil, nil, 0)
	}
	q := qs[0]
	if h.OpCode != 0 {
		resp.RCode = dnsmessage.RCodeNotImplemented
		return buildDNS(resp, &q, nil, 0)
	}
	if q.Class != dnsmessage.ClassINET {
		resp.RCode = dnsmessage.RCodeRefused
		return buildDNS(resp, &q, nil, 0)
	}
	rcode, addrs, ttl := n.lookup(q)
	resp.RCode = rcode
	return buildDNS(resp, &q, addrs, ttl)
}

// lookup resolves one question: A from the resolver (checked first), AAAA
// and other types with no records (the VM network is IPv4 only), the
// HostName always. ttl is the answer's TTL, within minNameTTL and
// maxNameTTL; the addresses stand for the name that long (plus nameGrace).
func (n *Network) lookup(q dnsmessage.Question) (rcode dnsmessage.RCode, addrs []netip.Addr, ttl time.Duration) {
	name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
	if name == HostName {
		if q.Type == dnsmessage.TypeA {
			n.names.add(name, hostAddr, defaultNameTTL+nameGrace)
			return dnsmessage.RCodeSuccess, []netip.Addr{hostAddr}, defaultNameTTL
		}
		return dnsmessage.RCodeSuccess, nil, 0
	}
	upstream := q.Type == dnsmessage.TypeA || q.Type == dnsmessage.TypeAAAA
	if d := n.cfg.Policy.CheckHost(name); !d.Allow {
		reason := d.Reason
		// Only the types that would be asked upstream are reported: a
		// reverse lookup (PTR) never leaves the shim.
		if upstream && n.reported.first("dns "+name, dnsReportWindow) {
			n.logf("vmnet: refused dns %q: %s", name, reason)
			n.violation(netpolicy.Violation{Protocol: "dns", Host: name, Reason: reason})
		}
		return dnsmessage.RCodeNameError, nil, 0
	}
	if q.Type != dnsmessage.TypeA {
		return dnsmessage.RCodeSuccess, nil, 0
	}
	ctx, cancel := context.WithTimeout(n.ctx, resolveTimeout)
	defer cancel()
	found, ttl, err := n.resolveA(ctx, name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return dnsmessage.RCodeNameError, nil, 0
		}
		n.logf("vmnet: dns %q: %v", name, err)
		return dnsmessage.RCodeServerFailure, nil, 0
	}
	ttl = min(max(ttl, minNameTTL), maxNameTTL)
	for _, a := range found {
		a = a.Unmap()
		// An address of the VM network would reach the gateway, not what
		// the name stands for.
		if !a.Is4() || subnet.Contains(a) || len(addrs) == maxAnswers {
			continue
		}
		addrs = append(addrs, a)
		n.names.add(name, a, ttl+nameGrace)
	}
	return dnsmessage.RCodeSuccess, addrs, ttl
}

// resolveA looks up name's IPv4 addresses and the TTL of the answer. A
// *net.Resolver is asked through Go's own DNS client (with its Dial), whose
// connections are watched for the TTLs of the records that come back; its
// search list, /etc/hosts and retries stay as they are. An answer whose TTL
// was not seen (from /etc/hosts, or from another Resolver) gets
// defaultNameTTL.
func (n *Network) resolveA(ctx context.Context, name string) ([]netip.Addr, time.Duration, error) {
	r, ok := n.resolver.(*net.Resolver)
	if !ok {
		addrs, err := n.resolver.LookupNetIP(ctx, "ip4", name)
		return addrs, defaultNameTTL, err
	}
	dial := r.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	seen := &ttlSeen{}
	watched := &net.Resolver{PreferGo: true, StrictErrors: r.StrictErrors, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return seen.watch(c), nil
	}}
	addrs, err := watched.LookupNetIP(ctx, "ip4", name)
	ttl, ok := seen.min()
	if !ok {
		ttl = defaultNameTTL
	}
	return addrs, ttl, err
}

// ttlSeen keeps the smallest TTL of the A and CNAME records in the DNS
// responses read through the connections it watches: the answer holds no
// longer than its shortest link. A response the resolver then throws away
// (a wrong ID) can only shorten it.
type ttlSeen struct {
	mu  sync.Mutex // guards the fields that follow
	ttl uint32
	ok  bool
}

func (s *ttlSeen) min() (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(s.ttl) * time.Second, s.ok
}

// message reads the TTLs of one DNS message.
func (s *ttlSeen) message(msg []byte) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || !h.Response || h.RCode != dnsmessage.RCodeSuccess || p.SkipAllQuestions() != nil {
		return
	}
	for {
		rh, err := p.AnswerHeader()
		if err != nil {
			return // the section's end, or a malformed record
		}
		if rh.Type == dnsmessage.TypeA || rh.Type == dnsmessage.TypeCNAME {
			s.mu.Lock()
			if !s.ok || rh.TTL < s.ttl {
				s.ttl, s.ok = rh.TTL, true
			}
			s.mu.Unlock()
		}
		if p.SkipAnswer() != nil {
			return
		}
	}
}

// watch wraps a connection Go's resolver dialled. net.Resolver.Dial's
// contract: a connection that is a net.PacketConn carries one message per
// datagram, any other is a stream of messages, each after its length (two
// bytes, big-endian).
func (s *ttlSeen) watch(c net.Conn) net.Conn {
	if pc, ok := c.(net.PacketConn); ok {
		return &ttlPacketConn{Conn: c, pc: pc, s: s}
	}
	return &ttlStreamConn{Conn: c, s: s}
}

type ttlPacketConn struct {
	net.Conn
	pc net.PacketConn
	s  *ttlSeen
}

func (c *ttlPacketConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.s.message(b[:n])
	}
	return n, err
}

func (c *ttlPacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, addr, err := c.pc.ReadFrom(b)
	if n > 0 {
		c.s.message(b[:n])
	}
	return n, addr, err
}

func (c *ttlPacketConn) WriteTo(b []byte, addr net.Addr) (int, error) { return c.pc.WriteTo(b, addr) }

type ttlStreamConn struct {
	net.Conn
	s   *ttlSeen
	buf []byte // bytes read of a message not complete yet
}

func (c *ttlStreamConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.buf = append(c.buf, b[:n]...)
	for len(c.buf) >= 2 {
		size := 2 + int(binary.BigEndian.Uint16(c.buf))
		if len(c.buf) < size {
			break
		}
		c.s.message(c.buf[2:size])
		c.buf = c.buf[size:]
	}
	return n, err
}

// buildDNS writes a response with the question q (if any) and A records
// with the given TTL.
func buildDNS(h dnsmessage.Header, q *dnsmessage.Question, addrs []netip.Addr, ttl time.Duration) []byte {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if q != nil {
		if err := b.StartQuestions(); err != nil {
			return nil
		}
		if err := b.Question(*q); err != nil {
			return nil
		}
		if err := b.StartAnswers(); err != nil {
			return nil
		}
		for _, a := range addrs {
			rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: uint32(ttl / time.Second)}
			if err := b.AResource(rh, dnsmessage.AResource{A: a.As4()}); err != nil {
				return nil
			}
		}
	}
	msg, err := b.Finish()
	if err != nil {
		return nil
	}
	return msg
}
