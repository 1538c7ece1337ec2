// Package testdns runs a tiny authoritative DNS server on loopback for tests.
package testdns

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// tcpReadTimeout bounds how long a TCP client may take to send one query.
const tcpReadTimeout = 5 * time.Second

// Start serves A and AAAA answers for records (names are case-insensitive, a
// trailing dot optional) over UDP and TCP on the same 127.0.0.1 port, and
// returns that "127.0.0.1:port". A known name with no address of the asked
// type gets an empty answer; an unknown name gets NXDOMAIN. The server stops
// at t.Cleanup.
//
// Give a name several addresses only if they are loopback: Go's resolver
// orders a multi-address answer (RFC 6724) by connecting a UDP socket to each
// address (no packet is sent, but the connect is still made).
func Start(t testing.TB, records map[string][]netip.Addr) (addr string) {
	t.Helper()
	return StartTTL(t, records, nil)
}

// StartTTL is Start with the TTL of each name's records, in seconds, from
// ttls (1 for a name it does not list).
func StartTTL(t testing.TB, records map[string][]netip.Addr, ttls map[string]uint32) (addr string) {
	t.Helper()
	s := &server{records: make(map[string][]netip.Addr), ttls: make(map[string]uint32), conns: make(map[net.Conn]struct{})}
	for name, addrs := range records {
		s.records[canonical(name)] = append(s.records[canonical(name)], addrs...)
	}
	for name, ttl := range ttls {
		s.ttls[canonical(name)] = ttl
	}
	pc, ln, err := listenBoth()
	if err != nil {
		t.Fatalf("testdns: %v", err)
	}
	s.wg.Add(2)
	go s.serveUDP(pc)
	go s.serveTCP(ln)
	t.Cleanup(func() {
		pc.Close()
		ln.Close()
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return pc.LocalAddr().String()
}

// Dialer returns a Dial function for net.Resolver that sends every query to
// addr, over the network the resolver asks for.
func Dialer(addr string) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
}

// listenBoth opens UDP on an ephemeral 127.0.0.1 port and TCP on the same
// port, retrying a few times if another process holds the TCP side.
func listenBoth() (net.PacketConn, net.Listener, error) {
	var lastErr error
	for range 10 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		lastErr = err
	}
	return nil, nil, lastErr
}

type server struct {
	records map[string][]netip.Addr // by canonical name; read-only after Start
	ttls    map[string]uint32       // by canonical name; read-only after Start
	wg      sync.WaitGroup

	mu     sync.Mutex // guards the fields that follow
	conns  map[net.Conn]struct{}
	closed bool
}

func canonical(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}

func (s *server) serveUDP(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if resp, ok := s.answer(buf[:n], 512); ok {
			pc.WriteTo(resp, from)
		}
	}
}

func (s *server) serveTCP(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveStream(c)
	}
}

func (s *server) serveStream(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	for {
		c.SetReadDeadline(time.Now().Add(tcpReadTimeout))
		var lenBuf [2]byte
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		resp, ok := s.answer(msg, 65535)
		if !ok {
			return
		}
		out := binary.BigEndian.AppendUint16(nil, uint16(len(resp)))
		if _, err := c.Write(append(out, resp...)); err != nil {
			return
		}
	}
}

// answer builds the reply to one query; ok is false for input that is not a
// query worth answering. Replies longer than limit are truncated (TC set).
func (s *server) answer(query []byte, limit int) (resp []byte, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	q, err := p.Question()
	if errors.Is(err, dnsmessage.ErrSectionDone) {
		return reply(dnsmessage.Header{ID: h.ID, Response: true, RCode: dnsmessage.RCodeFormatError}, nil, nil)
	}
	if err != nil {
		return nil, false
	}
	rh := dnsmessage.Header{
		ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired,
		RecursionAvailable: true, RCode: dnsmessage.RCodeSuccess,
	}
	addrs, known := s.records[canonical(q.Name.String())]
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
		return reply(rh, &q, nil)
	}
	ttl, ok := s.ttls[canonical(q.Name.String())]
	if !ok {
		ttl = 1
	}
	var answers []dnsmessage.Resource
	for _, a := range addrs {
		rrh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}
		switch {
		case q.Type == dnsmessage.TypeA && a.Unmap().Is4():
			rrh.Type = dnsmessage.TypeA
			answers = append(answers, dnsmessage.Resource{Header: rrh, Body: &dnsmessage.AResource{A: a.Unmap().As4()}})
		case q.Type == dnsmessage.TypeAAAA && a.Is6() && !a.Is4In6():
			rrh.Type = dnsmessage.TypeAAAA
			answers = append(answers, dnsmessage.Resource{Header: rrh, Body: &dnsmessage.AAAAResource{AAAA: a.As16()}})
		}
	}
	resp, ok = reply(rh, &q, answers)
	if ok && len(resp) > limit {
		rh.Truncated = true
		return reply(rh, &q, nil)
	}
	return resp, ok
}

func reply(h dnsmessage.Header, q *dnsmessage.Question, answers []dnsmessage.Resource) ([]byte, bool) {
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	if q != nil {
		if b.StartQuestions() != nil || b.Question(*q) != nil {
			return nil, false
		}
	}
	if b.StartAnswers() != nil {
		return nil, false
	}
	for _, a := range answers {
		var err error
		switch body := a.Body.(type) {
		case *dnsmessage.AResource:
			err = b.AResource(a.Header, *body)
		case *dnsmessage.AAAAResource:
			err = b.AAAAResource(a.Header, *body)
		}
		if err != nil {
			return nil, false
		}
	}
	msg, err := b.Finish()
	return msg, err == nil
}
