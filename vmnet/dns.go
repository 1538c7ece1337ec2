package vmnet

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/agentconnect-md/agentconnect/netpolicy"
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
	// answerTTL is the TTL of every answer, in seconds.
	answerTTL = 60
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
		return buildDNS(resp, nil, nil)
	}
	q := qs[0]
	if h.OpCode != 0 {
		resp.RCode = dnsmessage.RCodeNotImplemented
		return buildDNS(resp, &q, nil)
	}
	if q.Class != dnsmessage.ClassINET {
		resp.RCode = dnsmessage.RCodeRefused
		return buildDNS(resp, &q, nil)
	}
	rcode, addrs := n.lookup(q)
	resp.RCode = rcode
	return buildDNS(resp, &q, addrs)
}

// lookup resolves one question: A from the resolver (checked first), AAAA
// and other types with no records (the VM network is IPv4 only), the
// HostName always.
func (n *Network) lookup(q dnsmessage.Question) (dnsmessage.RCode, []netip.Addr) {
	name := strings.TrimSuffix(strings.ToLower(q.Name.String()), ".")
	if name == HostName {
		if q.Type == dnsmessage.TypeA {
			n.names.add(name, hostAddr)
			return dnsmessage.RCodeSuccess, []netip.Addr{hostAddr}
		}
		return dnsmessage.RCodeSuccess, nil
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
		return dnsmessage.RCodeNameError, nil
	}
	if q.Type != dnsmessage.TypeA {
		return dnsmessage.RCodeSuccess, nil
	}
	ctx, cancel := context.WithTimeout(n.ctx, resolveTimeout)
	defer cancel()
	found, err := n.resolver.LookupNetIP(ctx, "ip4", name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return dnsmessage.RCodeNameError, nil
		}
		n.logf("vmnet: dns %q: %v", name, err)
		return dnsmessage.RCodeServerFailure, nil
	}
	var addrs []netip.Addr
	for _, a := range found {
		a = a.Unmap()
		// An address of the VM network would reach the gateway, not what
		// the name stands for.
		if !a.Is4() || subnet.Contains(a) || len(addrs) == maxAnswers {
			continue
		}
		addrs = append(addrs, a)
		n.names.add(name, a)
	}
	return dnsmessage.RCodeSuccess, addrs
}

// buildDNS writes a response with the question q (if any) and A records.
func buildDNS(h dnsmessage.Header, q *dnsmessage.Question, addrs []netip.Addr) []byte {
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
			rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: answerTTL}
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
