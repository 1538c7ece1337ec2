package vmnet

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/agentconnect-md/agentconnect/internal/testdns"
)

// answerTTLs asks the gateway's DNS for name's A records and returns their
// addresses and TTLs.
func (g *fakeGuest) answerTTLs(name string) ([]netip.Addr, []uint32) {
	g.t.Helper()
	c := g.dialUDP(GatewayIP, 53)
	defer c.Close()
	if _, err := c.Write(dnsQuery(g.t, name, dnsmessage.TypeA)); err != nil {
		g.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 2048)
	nr, err := c.Read(buf)
	if err != nil {
		g.t.Fatalf("dns %s: %v", name, err)
	}
	var p dnsmessage.Parser
	if _, err := p.Start(buf[:nr]); err != nil {
		g.t.Fatal(err)
	}
	if err := p.SkipAllQuestions(); err != nil {
		g.t.Fatal(err)
	}
	var addrs []netip.Addr
	var ttls []uint32
	for {
		ah, err := p.AnswerHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			return addrs, ttls
		}
		if err != nil {
			g.t.Fatal(err)
		}
		a, err := p.AResource()
		if err != nil {
			g.t.Fatal(err)
		}
		addrs = append(addrs, netip.AddrFrom4(a.A))
		ttls = append(ttls, ah.TTL)
	}
}

// startWithDNS is start with a real resolver that asks a loopback DNS server
// serving records with the given TTLs.
func startWithDNS(t *testing.T, policy string, records map[string][]netip.Addr, ttls map[string]uint32, dials *dialRecorder) *setup {
	t.Helper()
	var allowed []string
	if policy != "" {
		allowed = []string{policy}
	}
	st := &setup{rec: &recorder{}, dials: dials}
	return st.attach(t, Config{
		Policy:      mustPolicy(t, allowed, nil),
		Resolver:    &net.Resolver{PreferGo: true, Dial: testdns.Dialer(testdns.StartTTL(t, records, ttls))},
		OnViolation: st.rec.add,
		Logf:        t.Logf,
	})
}

// TestDNSAnswerTTL: the guest is told the upstream answer's TTL, raised to
// the floor and cut to the cap, over UDP and (for an answer too long for a
// datagram) TCP upstream.
func TestDNSAnswerTTL(t *testing.T) {
	var many []netip.Addr // more than fit in 512 bytes: the resolver retries over TCP
	for i := 1; i <= 40; i++ {
		many = append(many, netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}))
	}
	public := []netip.Addr{netip.MustParseAddr("192.31.196.7")}
	st := startWithDNS(t, "", map[string][]netip.Addr{
		"zero.example": public, "mid.example": public, "week.example": public, "many.example": many,
	}, map[string]uint32{"zero.example": 0, "mid.example": 300, "week.example": 7 * 24 * 3600, "many.example": 120}, nil)
	for _, c := range []struct {
		name string
		want uint32
	}{
		{"zero.example", uint32(minNameTTL / time.Second)},
		{"mid.example", 300},
		{"week.example", uint32(maxNameTTL / time.Second)},
		{"many.example", 120},
	} {
		addrs, ttls := st.g.answerTTLs(c.name)
		if len(addrs) == 0 {
			t.Errorf("%s: no answer", c.name)
		}
		for _, ttl := range ttls {
			if ttl != c.want {
				t.Errorf("%s: TTL %d, want %d", c.name, ttl, c.want)
			}
		}
	}
}

// TestNameCacheExpires: a name's addresses stand for it only until its TTL
// (and the grace) runs out; then a connection to the address is judged by the
// address alone, until the guest resolves the name again.
func TestNameCacheExpires(t *testing.T) {
	echoAddr, _ := echoTCP(t)
	dials := &dialRecorder{tcpAddr: echoAddr}
	st := startWithDNS(t, "mid.example", map[string][]netip.Addr{"mid.example": {netip.MustParseAddr("192.31.196.7")}},
		map[string]uint32{"mid.example": 300}, dials)
	var offset time.Duration
	st.n.names.mu.Lock()
	st.n.names.now = func() time.Time { return time.Now().Add(offset) }
	st.n.names.mu.Unlock()
	advance := func(d time.Duration) {
		st.n.names.mu.Lock()
		offset += d
		st.n.names.mu.Unlock()
	}

	if addrs, _ := st.g.answerTTLs("mid.example"); len(addrs) != 1 {
		t.Fatalf("mid.example resolved to %v", addrs)
	}
	connect := func() error {
		c, err := st.g.dialTCP("192.31.196.7", 443)
		if err == nil {
			echo(t, c, "hello")
		}
		return err
	}
	if err := connect(); err != nil {
		t.Fatalf("connection by the resolved name: %v", err)
	}
	advance(300*time.Second - time.Second) // within the TTL
	if err := connect(); err != nil {
		t.Fatalf("connection within the TTL: %v", err)
	}
	advance(time.Second + nameGrace) // past the TTL and the grace
	wantRefused(t, connect())
	if v := onlyViolation(t, st.rec); v.Host != "192.31.196.7" || !strings.Contains(v.Reason, "not in allowedDomains") {
		t.Errorf("violation %+v, want the address judged alone", v)
	}
	if addrs, _ := st.g.answerTTLs("mid.example"); len(addrs) != 1 {
		t.Fatalf("mid.example resolved again to %v", addrs)
	}
	if err := connect(); err != nil {
		t.Fatalf("connection after resolving again: %v", err)
	}
}

// TestTCPIdleTimeout: a forwarded connection with no byte either way is
// closed, at both ends.
func TestTCPIdleTimeout(t *testing.T) {
	hold, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	hostSide := make(chan error, 1)
	go func() {
		c, err := hold.Accept()
		if err != nil {
			hostSide <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(c, c) // echoes; ends when vmnet closes its side
		hostSide <- err
	}()
	n, err := New(Config{Dial: (&dialRecorder{tcpAddr: hold.Addr().String()}).dial, Logf: t.Logf, TCPIdleTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	g := newGuest(t, n)
	c, err := g.dialTCP("192.31.196.7", 443)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// Then nothing either way: vmnet must close it before the deadlines.
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Errorf("idle connection: read %q, %v; want it closed", b, err)
	}
	if err := <-hostSide; err != nil {
		t.Errorf("the host side: %v, want closed by vmnet", err)
	}
}

// TestUDPFlowsHoldAndFreeSlots: a UDP flow takes a connection slot while it
// lives and gives it back once idle.
func TestUDPFlowsHoldAndFreeSlots(t *testing.T) {
	udpEcho, _ := echoUDP(t)
	tcpEcho, _ := echoTCP(t)
	for _, idle := range []time.Duration{0, 100 * time.Millisecond} {
		t.Run(fmt.Sprint("idle ", idle), func(t *testing.T) {
			dials := &dialRecorder{tcpAddr: tcpEcho, udpAddr: udpEcho}
			n, err := New(Config{Dial: dials.dial, Logf: t.Logf, MaxConns: 1, UDPIdleTimeout: idle})
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			g := newGuest(t, n)
			u := g.dialUDP("192.31.196.7", 3478)
			defer u.Close()
			u.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(u, "stun?"); err != nil {
				t.Fatal(err)
			}
			if _, err := u.Read(make([]byte, 100)); err != nil {
				t.Fatal(err)
			}
			if idle == 0 { // the default, 60 s: the flow holds the only slot
				_, err := g.dialTCP("192.31.196.7", 443)
				wantRefused(t, err)
				return
			}
			for i := 0; ; i++ {
				c, err := g.dialTCP("192.31.196.7", 443)
				if err == nil {
					echo(t, c, "after the flow")
					return
				}
				if i == 200 {
					t.Fatalf("the idle flow's slot was not given back: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
