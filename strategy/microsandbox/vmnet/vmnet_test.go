package vmnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// fakeResolver answers from a table and records what it was asked.
type fakeResolver struct {
	mu    sync.Mutex
	table map[string][]netip.Addr
	asked []string
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, host)
	if addrs, ok := r.table[host]; ok {
		var out []netip.Addr
		for _, a := range addrs {
			if network == "ip4" && !a.Is4() {
				continue
			}
			out = append(out, a)
		}
		return out, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (r *fakeResolver) wasAsked(host string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.asked {
		if h == host {
			return true
		}
	}
	return false
}

func defaultResolver() *fakeResolver {
	return &fakeResolver{table: map[string][]netip.Addr{
		"pub.example":     {netip.MustParseAddr("192.31.196.7"), netip.MustParseAddr("2620:4f:8000::7")},
		"good.example":    {netip.MustParseAddr("192.31.196.7")},
		"other.example":   {netip.MustParseAddr("192.175.48.9")},
		"bad.example":     {netip.MustParseAddr("192.175.48.66")},
		"private.example": {netip.MustParseAddr("10.0.0.5")},
		"inside.example":  {netip.MustParseAddr("192.168.127.1"), netip.MustParseAddr("192.31.196.8")},
	}}
}

// recorder collects violations.
type recorder struct {
	mu sync.Mutex
	vs []netpolicy.Violation
}

func (r *recorder) add(v netpolicy.Violation) {
	r.mu.Lock()
	r.vs = append(r.vs, v)
	r.mu.Unlock()
}

func (r *recorder) all() []netpolicy.Violation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]netpolicy.Violation(nil), r.vs...)
}

// dialRecorder stands in for Config.Dial: it records the address it was
// asked for and connects to a loopback server instead, so nothing leaves
// loopback.
type dialRecorder struct {
	mu      sync.Mutex
	addrs   []string
	tcpAddr string // where "tcp" dials go
	udpAddr string // where "udp" dials go
	block   string // a "network addr" whose dial blocks until ctx ends
}

func (d *dialRecorder) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, network+" "+addr)
	to := d.tcpAddr
	if network == "udp" {
		to = d.udpAddr
	}
	block := d.block == network+" "+addr
	d.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, to)
}

func (d *dialRecorder) asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.addrs...)
}

// echoTCP serves a loopback TCP echo server: it echoes until EOF, then
// half-closes.
func echoTCP(t *testing.T) (addr string, port int) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return l.Addr().String(), l.Addr().(*net.TCPAddr).Port
}

// echoUDP serves a loopback UDP echo server.
func echoUDP(t *testing.T) (addr string, port int) {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(buf[:n], from)
		}
	}()
	return c.LocalAddr().String(), c.LocalAddr().(*net.UDPAddr).Port
}

func mustPolicy(t *testing.T, allowed, denied []string) *netpolicy.Policy {
	t.Helper()
	p, err := netpolicy.New(allowed, denied)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type setup struct {
	n     *Network
	g     *fakeGuest
	res   *fakeResolver
	rec   *recorder
	dials *dialRecorder
}

// start builds a network with policy, a fake resolver and (when dials is
// not nil) an injected Dial, and attaches a fake guest.
func start(t *testing.T, policy *netpolicy.Policy, dials *dialRecorder) *setup {
	t.Helper()
	st := &setup{res: defaultResolver(), rec: &recorder{}, dials: dials}
	return st.attach(t, Config{Policy: policy, Resolver: st.res, OnViolation: st.rec.add, Logf: t.Logf})
}

// attach starts a network with cfg (dialling through st.dials when it is
// not nil) and a fake guest on it.
func (st *setup) attach(t *testing.T, cfg Config) *setup {
	t.Helper()
	if st.dials != nil {
		cfg.Dial = st.dials.dial
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st.n = n
	st.g = newGuest(t, n)
	t.Cleanup(func() {
		st.g.close()
		n.Close()
	})
	return st
}

// echo checks that c echoes msg, half-closing to end it.
func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != msg {
		t.Fatalf("echo: got %q, want %q", got, msg)
	}
}

func wantRefused(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("connection succeeded; want it refused")
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Fatalf("error %v; want connection refused", err)
	}
}

// onlyViolation checks that exactly one violation was reported and returns
// it.
func onlyViolation(t *testing.T, rec *recorder) netpolicy.Violation {
	t.Helper()
	vs := rec.all()
	if len(vs) != 1 {
		t.Fatalf("violations: %+v; want exactly one", vs)
	}
	return vs[0]
}

func TestDNS(t *testing.T) {
	st := start(t, mustPolicy(t, nil, []string{"bad.example"}), nil)
	g := st.g

	rcode, addrs := g.resolve("pub.example", dnsmessage.TypeA)
	if rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("192.31.196.7") {
		t.Fatalf("A pub.example: %v %v", rcode, addrs)
	}
	// Case and the TCP transport do not matter.
	rcode, addrs = g.resolveTCP("PUB.example", dnsmessage.TypeA)
	if rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("192.31.196.7") {
		t.Fatalf("A PUB.example over TCP: %v %v", rcode, addrs)
	}
	// The VM network is IPv4 only: AAAA has no records.
	if rcode, addrs := g.resolve("pub.example", dnsmessage.TypeAAAA); rcode != dnsmessage.RCodeSuccess || len(addrs) != 0 {
		t.Fatalf("AAAA pub.example: %v %v", rcode, addrs)
	}
	// Other types: no records, nothing asked upstream.
	if rcode, addrs := g.resolve("mx.example", dnsmessage.TypeMX); rcode != dnsmessage.RCodeSuccess || len(addrs) != 0 || st.res.wasAsked("mx.example") {
		t.Fatalf("MX mx.example: %v %v", rcode, addrs)
	}
	if rcode, _ := g.resolve("missing.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeNameError {
		t.Fatalf("A missing.example: %v; want NXDOMAIN", rcode)
	}
	// Addresses of the VM network itself are left out.
	if rcode, addrs := g.resolve("inside.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("192.31.196.8") {
		t.Fatalf("A inside.example: %v %v", rcode, addrs)
	}
	if rcode, addrs := g.resolve(HostName, dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != hostAddr {
		t.Fatalf("A %s: %v %v", HostName, rcode, addrs)
	}
	if vs := st.rec.all(); len(vs) != 0 {
		t.Fatalf("violations: %+v", vs)
	}

	// A denied name: NXDOMAIN, a violation, and no upstream lookup.
	if rcode, addrs := g.resolve("bad.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeNameError || len(addrs) != 0 {
		t.Fatalf("A bad.example: %v %v; want NXDOMAIN", rcode, addrs)
	}
	if rcode, _ := g.resolve("bad.example", dnsmessage.TypeAAAA); rcode != dnsmessage.RCodeNameError {
		t.Fatalf("AAAA bad.example: %v; want NXDOMAIN", rcode)
	}
	v := onlyViolation(t, st.rec) // A and AAAA: reported once
	if v.Protocol != "dns" || v.Host != "bad.example" || v.Port != 0 || !strings.Contains(v.Reason, "denied") || strings.Contains(v.Reason, ":0") {
		t.Fatalf("violation %+v", v)
	}
	if st.res.wasAsked("bad.example") {
		t.Fatal("the resolver was asked for a denied name")
	}
}

func TestTCPToHostLoopback(t *testing.T) {
	_, port := echoTCP(t)

	t.Run("refused without an entry", func(t *testing.T) {
		st := start(t, nil, nil)
		_, err := st.g.dialTCP(HostIP, port)
		wantRefused(t, err)
		v := onlyViolation(t, st.rec)
		if v.Protocol != "tcp" || v.Host != "127.0.0.1" || v.Addr != "127.0.0.1" || v.Port != port || !strings.Contains(v.Reason, "loopback") {
			t.Fatalf("violation %+v", v)
		}
	})

	t.Run("allowed with an entry", func(t *testing.T) {
		st := start(t, mustPolicy(t, []string{"127.0.0.1:" + strconv.Itoa(port)}, nil), nil)
		c, err := st.g.dialTCP(HostIP, port)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "hello through the host's loopback")
		// Through the name as well.
		if rcode, _ := st.g.resolve(HostName, dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
			t.Fatal(rcode)
		}
		c, err = st.g.dialTCP(HostIP, port)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "again")
		// Another port is still refused, and explained by the address.
		_, err = st.g.dialTCP(HostIP, port+1)
		wantRefused(t, err)
		v := onlyViolation(t, st.rec)
		if v.Host != "127.0.0.1" || !strings.Contains(v.Reason, "127.0.0.1:"+strconv.Itoa(port+1)) {
			t.Fatalf("violation %+v", v)
		}
	})

	t.Run("the gateway is not the host", func(t *testing.T) {
		st := start(t, mustPolicy(t, []string{"127.0.0.1:" + strconv.Itoa(port), GatewayIP + ":" + strconv.Itoa(port)}, nil), nil)
		_, err := st.g.dialTCP(GatewayIP, port)
		wantRefused(t, err)
		v := onlyViolation(t, st.rec)
		if v.Host != GatewayIP || !strings.Contains(v.Reason, "gateway") {
			t.Fatalf("violation %+v", v)
		}
		_, err = st.g.dialTCP("192.168.127.9", port)
		if err == nil {
			t.Fatal("reached another address of the VM network")
		}
	})
}

func TestPublicAllowedByDefault(t *testing.T) {
	echoAddr, _ := echoTCP(t)
	dials := &dialRecorder{tcpAddr: echoAddr}
	st := start(t, nil, dials)

	rcode, addrs := st.g.resolve("pub.example", dnsmessage.TypeA)
	if rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 {
		t.Fatalf("%v %v", rcode, addrs)
	}
	c, err := st.g.dialTCP(addrs[0].String(), 443)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "public")
	if got := dials.asked(); len(got) != 1 || got[0] != "tcp 192.31.196.7:443" {
		t.Fatalf("dialled %v; want [tcp 192.31.196.7:443]", got)
	}
	// An address no name resolved to is judged as itself: public, allowed.
	c, err = st.g.dialTCP("192.175.48.200", 80)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "literal")
	if vs := st.rec.all(); len(vs) != 0 {
		t.Fatalf("violations: %+v", vs)
	}
}

func TestPrivateAddressRefused(t *testing.T) {
	echoAddr, _ := echoTCP(t)
	dials := &dialRecorder{tcpAddr: echoAddr}
	st := start(t, nil, dials)

	rcode, addrs := st.g.resolve("private.example", dnsmessage.TypeA)
	if rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0] != netip.MustParseAddr("10.0.0.5") {
		t.Fatalf("%v %v", rcode, addrs)
	}
	_, err := st.g.dialTCP("10.0.0.5", 443)
	wantRefused(t, err)
	v := onlyViolation(t, st.rec)
	if v.Protocol != "tcp" || v.Host != "private.example" || v.Addr != "10.0.0.5" || v.Port != 443 || !strings.Contains(v.Reason, "private address") {
		t.Fatalf("violation %+v", v)
	}
	if got := dials.asked(); len(got) != 0 {
		t.Fatalf("dialled %v", got)
	}
}

func TestAllowlist(t *testing.T) {
	echoAddr, _ := echoTCP(t)

	t.Run("only listed names", func(t *testing.T) {
		dials := &dialRecorder{tcpAddr: echoAddr}
		st := start(t, mustPolicy(t, []string{"good.example"}, nil), dials)
		if rcode, addrs := st.g.resolve("good.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 {
			t.Fatalf("good.example: %v %v", rcode, addrs)
		}
		c, err := st.g.dialTCP("192.31.196.7", 443)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "good")

		if rcode, _ := st.g.resolve("other.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeNameError {
			t.Fatalf("other.example: %v; want NXDOMAIN", rcode)
		}
		if st.res.wasAsked("other.example") {
			t.Fatal("the resolver was asked for a name outside the allowlist")
		}
		v := onlyViolation(t, st.rec)
		if v.Protocol != "dns" || v.Host != "other.example" || !strings.Contains(v.Reason, "not in allowedDomains") {
			t.Fatalf("violation %+v", v)
		}
		// An address that no allowed name resolved to is refused.
		_, err = st.g.dialTCP("192.175.48.9", 443)
		wantRefused(t, err)
		if vs := st.rec.all(); len(vs) != 2 || vs[1].Host != "192.175.48.9" {
			t.Fatalf("violations %+v", vs)
		}
		if got := dials.asked(); len(got) != 1 {
			t.Fatalf("dialled %v", got)
		}
	})

	t.Run("a name listed with a port resolves", func(t *testing.T) {
		dials := &dialRecorder{tcpAddr: echoAddr}
		st := start(t, mustPolicy(t, []string{"good.example:443"}, nil), dials)
		if rcode, addrs := st.g.resolve("good.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 {
			t.Fatalf("good.example: %v %v", rcode, addrs)
		}
		c, err := st.g.dialTCP("192.31.196.7", 443)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "port 443")
		_, err = st.g.dialTCP("192.31.196.7", 80)
		wantRefused(t, err)
		v := onlyViolation(t, st.rec)
		if v.Host != "good.example" || v.Port != 80 {
			t.Fatalf("violation %+v", v)
		}
	})

	t.Run("deny wins", func(t *testing.T) {
		dials := &dialRecorder{tcpAddr: echoAddr}
		st := start(t, mustPolicy(t, []string{"*.example"}, []string{"bad.example", "192.31.196.7"}), dials)
		if rcode, _ := st.g.resolve("bad.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeNameError {
			t.Fatalf("bad.example: %v; want NXDOMAIN", rcode)
		}
		// good.example is allowed by name, but its address is denied.
		if rcode, addrs := st.g.resolve("good.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess || len(addrs) != 1 {
			t.Fatalf("good.example: %v %v", rcode, addrs)
		}
		_, err := st.g.dialTCP("192.31.196.7", 443)
		wantRefused(t, err)
		// other.example is allowed.
		if rcode, _ := st.g.resolve("other.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
			t.Fatal(rcode)
		}
		c, err := st.g.dialTCP("192.175.48.9", 443)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, c, "other")
		vs := st.rec.all()
		if len(vs) != 2 || vs[0].Protocol != "dns" || vs[0].Host != "bad.example" ||
			vs[1].Protocol != "tcp" || vs[1].Host != "good.example" || !strings.Contains(vs[1].Reason, "denied") {
			t.Fatalf("violations %+v", vs)
		}
		if got := dials.asked(); len(got) != 1 || got[0] != "tcp 192.175.48.9:443" {
			t.Fatalf("dialled %v", got)
		}
	})
}

func TestUDP(t *testing.T) {
	_, port := echoUDP(t)
	st := start(t, mustPolicy(t, []string{"127.0.0.1:" + strconv.Itoa(port)}, nil), nil)

	exchange := func(c net.Conn, msg string, timeout time.Duration) (string, error) {
		if _, err := io.WriteString(c, msg); err != nil {
			return "", err
		}
		c.SetReadDeadline(time.Now().Add(timeout))
		buf := make([]byte, 2048)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}

	// Allowed: relayed to the loopback echo server through HostIP.
	c := st.g.dialUDP(HostIP, port)
	for i := range 3 {
		msg := fmt.Sprintf("datagram %d", i)
		got, err := exchange(c, msg, 10*time.Second)
		if err != nil || got != msg {
			t.Fatalf("echo: %q, %v", got, err)
		}
	}
	c.Close()

	// Refused: dropped, reported once.
	c = st.g.dialUDP(HostIP, port+1)
	defer c.Close()
	for range 3 {
		if got, err := exchange(c, "let me out", 300*time.Millisecond); err == nil {
			t.Fatalf("refused datagram answered: %q", got)
		}
	}
	v := onlyViolation(t, st.rec)
	if v.Protocol != "udp" || v.Host != "127.0.0.1" || v.Port != port+1 || v.Addr != "127.0.0.1" {
		t.Fatalf("violation %+v", v)
	}
}

func TestUDPInjectedDial(t *testing.T) {
	echoAddr, _ := echoUDP(t)
	dials := &dialRecorder{udpAddr: echoAddr}
	st := start(t, nil, dials)
	if rcode, _ := st.g.resolve("pub.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
		t.Fatal(rcode)
	}
	c := st.g.dialUDP("192.31.196.7", 3478)
	defer c.Close()
	if _, err := io.WriteString(c, "stun?"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "stun?" {
		t.Fatalf("%q %v", buf[:n], err)
	}
	if got := dials.asked(); len(got) != 1 || got[0] != "udp 192.31.196.7:3478" {
		t.Fatalf("dialled %v", got)
	}
}

func TestTwoNetworks(t *testing.T) {
	echoAddr, _ := echoTCP(t)
	policy := mustPolicy(t, []string{"good.example"}, nil)
	dials1 := &dialRecorder{tcpAddr: echoAddr}
	dials2 := &dialRecorder{tcpAddr: echoAddr}
	a := start(t, policy, dials1)
	b := start(t, policy, dials2)

	// Both guests are 192.168.127.2 and work at the same time.
	var wg sync.WaitGroup
	for _, st := range []*setup{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if rcode, _ := st.g.resolve(HostName, dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
					t.Error(rcode)
				}
			}
		}()
	}
	wg.Wait()

	// What one network's DNS resolved does not open anything in the other.
	if rcode, _ := a.g.resolve("good.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
		t.Fatal(rcode)
	}
	c, err := a.g.dialTCP("192.31.196.7", 443)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "a")
	_, err = b.g.dialTCP("192.31.196.7", 443)
	wantRefused(t, err)
	if vs := a.rec.all(); len(vs) != 0 {
		t.Fatalf("a's violations: %+v", vs)
	}
	if v := onlyViolation(t, b.rec); v.Host != "192.31.196.7" {
		t.Fatalf("b's violation %+v", v)
	}
	if len(dials1.asked()) != 1 || len(dials2.asked()) != 0 {
		t.Fatalf("dials: %v %v", dials1.asked(), dials2.asked())
	}
}

func TestMaxConns(t *testing.T) {
	echoAddr, _ := echoTCP(t)
	dials := &dialRecorder{tcpAddr: echoAddr}
	res := defaultResolver()
	n, err := New(Config{Resolver: res, Dial: dials.dial, Logf: t.Logf, MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	g := newGuest(t, n)
	first, err := g.dialTCP("192.31.196.7", 443)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.dialTCP("192.31.196.7", 443)
	wantRefused(t, err)
	echo(t, first, "first")
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := g.dialTCP("192.31.196.7", 443)
		if err == nil {
			echo(t, c, "third")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot was not released: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServeQEMU(t *testing.T) {
	n, err := New(Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	// A frame longer than any NIC sends ends the connection.
	host, guest := net.Pipe()
	errc := make(chan error, 1)
	go func() { errc <- n.ServeQEMU(context.Background(), host) }()
	time.Sleep(10 * time.Millisecond)
	// While it serves, a second connection is refused.
	h2, g2 := net.Pipe()
	defer g2.Close()
	if err := n.ServeQEMU(context.Background(), h2); !errors.Is(err, ErrBusy) {
		t.Fatalf("second ServeQEMU: %v; want ErrBusy", err)
	}
	guest.Write([]byte{0xff, 0xff, 0xff, 0xff})
	if err := <-errc; err == nil || !strings.Contains(err.Error(), "frame") {
		t.Fatalf("ServeQEMU: %v; want a frame size error", err)
	}
	guest.Close()

	// A clean EOF returns nil; so does ending ctx.
	host, guest = net.Pipe()
	go func() { errc <- n.ServeQEMU(context.Background(), host) }()
	guest.Close()
	if err := <-errc; err != nil {
		t.Fatalf("ServeQEMU after EOF: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	host, guest = net.Pipe()
	defer guest.Close()
	go func() { errc <- n.ServeQEMU(ctx, host) }()
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("ServeQEMU after cancel: %v", err)
	}
}

func TestAcceptFrame(t *testing.T) {
	frame := func(dstMAC []byte, etherType uint16, proto byte, src, dst [4]byte) []byte {
		f := make([]byte, 14+20+8)
		copy(f[0:6], dstMAC)
		copy(f[6:12], []byte{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xee})
		f[12], f[13] = byte(etherType>>8), byte(etherType)
		ip := f[14:]
		ip[0] = 0x45
		ip[9] = proto
		copy(ip[12:16], src[:])
		copy(ip[16:20], dst[:])
		return f
	}
	gw := []byte(gatewayLinkAddr)
	guest := [4]byte{192, 168, 127, 2}
	public := [4]byte{198, 51, 100, 7}
	cases := []struct {
		name string
		f    []byte
		want bool
	}{
		{"tcp", frame(gw, 0x0800, 6, guest, public), true},
		{"udp", frame(gw, 0x0800, 17, guest, public), true},
		{"icmp", frame(gw, 0x0800, 1, guest, public), false},
		{"spoofed source", frame(gw, 0x0800, 6, [4]byte{192, 168, 127, 3}, public), false},
		{"multicast", frame(gw, 0x0800, 17, guest, [4]byte{224, 0, 0, 251}), false},
		{"broadcast", frame(gw, 0x0800, 17, guest, [4]byte{255, 255, 255, 255}), false},
		{"subnet broadcast", frame(gw, 0x0800, 17, guest, [4]byte{192, 168, 127, 255}), false},
		{"not to the gateway", frame([]byte{2, 0, 0, 0, 0, 1}, 0x0800, 6, guest, public), false},
		{"ipv6", frame(gw, 0x86dd, 6, guest, public), false},
		{"short", []byte{1, 2, 3}, false},
	}
	for _, c := range cases {
		if _, got := acceptFrame(c.f); got != c.want {
			t.Errorf("%s: accepted %v, want %v", c.name, got, c.want)
		}
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	tcpEcho, _ := echoTCP(t)
	udpEcho, _ := echoUDP(t)
	run := func() {
		dials := &dialRecorder{tcpAddr: tcpEcho, udpAddr: udpEcho, block: "tcp 192.31.196.99:1"}
		n, err := New(Config{Resolver: defaultResolver(), Dial: dials.dial, Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		g := newGuest(t, n)
		if rcode, _ := g.resolve("pub.example", dnsmessage.TypeA); rcode != dnsmessage.RCodeSuccess {
			t.Fatal(rcode)
		}
		// Leave a TCP connection, a UDP flow and a DNS TCP connection open.
		c, err := g.dialTCP("192.31.196.7", 443)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "x"); err != nil {
			t.Fatal(err)
		}
		u := g.dialUDP("192.31.196.7", 53)
		defer u.Close()
		u.Write([]byte("y"))
		u.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := u.Read(make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		d, err := g.dialTCP(GatewayIP, 53)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		// And a connection whose dial hangs.
		ctx, cancel := context.WithCancel(context.Background())
		pending := make(chan error, 1)
		go func() {
			_, err := gonet.DialContextTCP(ctx, g.s, fullAddr("192.31.196.99", 1), ipv4.ProtocolNumber)
			pending <- err
		}()
		for len(dials.asked()) < 3 {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)

		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-g.serveErr:
			if err != nil {
				t.Fatalf("ServeQEMU: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("ServeQEMU did not return after Close")
		}
		cancel()
		if err := <-pending; err == nil {
			t.Fatal("the hanging dial connected")
		}
		g.close()
	}
	// settled returns the goroutine count once it has not changed for 100 ms.
	settled := func() int {
		n := runtime.NumGoroutine()
		for range 50 {
			time.Sleep(100 * time.Millisecond)
			m := runtime.NumGoroutine()
			if m == n {
				break
			}
			n = m
		}
		return n
	}
	run() // once first, so that one-time goroutines of the libraries exist
	before := settled()
	run()
	t.Logf("goroutines: %d before, %d right after Close", before, runtime.NumGoroutine())
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDialGuest: a forward's connection from the gateway reaches a server
// on the guest's address; a port nobody listens on is refused; a closed
// network dials nothing.
func TestDialGuest(t *testing.T) {
	n, err := New(Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	g := newGuest(t, n)
	l, err := gonet.ListenTCP(g.s, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(guestAddr.As4()), Port: 8080}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	ctx := context.Background()
	c, err := n.DialGuest(ctx, 8080)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Errorf("echo through the forward: %q %v", buf, err)
	}
	c.Close()
	if _, err := n.DialGuest(ctx, 8081); err == nil {
		t.Error("a port nobody listens on was connected")
	}
	if _, err := n.DialGuest(ctx, 0); err == nil {
		t.Error("port 0 was dialled")
	}
	n.Close()
	if _, err := n.DialGuest(ctx, 8080); err == nil {
		t.Error("a closed network dialled")
	}
}
