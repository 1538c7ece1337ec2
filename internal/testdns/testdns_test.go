package testdns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func resolver(addr string, forceTCP bool) *net.Resolver {
	dial := Dialer(addr)
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, a string) (net.Conn, error) {
		if forceTCP {
			network = "tcp"
		}
		return dial(ctx, network, a)
	}}
}

func sorted(addrs []netip.Addr) []netip.Addr {
	addrs = slices.Clone(addrs)
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs
}

func TestLookup(t *testing.T) {
	// Loopback addresses only: Go's resolver orders an answer with several
	// addresses (RFC 6724) by connecting a UDP socket to each of them.
	v4, v6 := netip.MustParseAddr("127.0.0.7"), netip.MustParseAddr("::1")
	var many []netip.Addr
	for i := range 60 {
		many = append(many, netip.AddrFrom4([4]byte{127, 0, 1, byte(i)}))
	}
	addr := Start(t, map[string][]netip.Addr{
		"Origin.Test.": {v4, v6},
		"loop.test":    {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")},
		"mapped.test":  {netip.MustParseAddr("::ffff:127.0.0.9")},
		"v6only.test":  {v6},
		"many.test":    many, // too big for a 512-byte UDP answer: the resolver retries over TCP
	})
	tests := []struct {
		network, host string
		want          []netip.Addr
	}{
		{"ip", "origin.test", []netip.Addr{v4, v6}},
		{"ip4", "origin.test", []netip.Addr{v4}},
		{"ip6", "origin.test", []netip.Addr{v6}},
		{"ip", "ORIGIN.TEST.", []netip.Addr{v4, v6}},
		{"ip", "loop.test", []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}},
		{"ip", "mapped.test", []netip.Addr{netip.MustParseAddr("127.0.0.9")}},
		{"ip6", "v6only.test", []netip.Addr{v6}},
		{"ip", "many.test", many},
	}
	for _, forceTCP := range []bool{false, true} {
		r := resolver(addr, forceTCP)
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/%s/tcp=%v", tt.network, tt.host, forceTCP), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				got, err := r.LookupNetIP(ctx, tt.network, tt.host)
				if err != nil {
					t.Fatalf("LookupNetIP(%s, %s) = %v", tt.network, tt.host, err)
				}
				if !slices.Equal(sorted(got), sorted(tt.want)) {
					t.Errorf("LookupNetIP(%s, %s) = %v, want %v", tt.network, tt.host, got, tt.want)
				}
			})
		}
	}
}

func TestNotFound(t *testing.T) {
	addr := Start(t, map[string][]netip.Addr{"v6only.test": {netip.MustParseAddr("::1")}})
	r := resolver(addr, false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tt := range []struct{ network, host string }{{"ip", "unknown.test"}, {"ip4", "v6only.test"}} {
		got, err := r.LookupNetIP(ctx, tt.network, tt.host)
		var dnsErr *net.DNSError
		if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
			t.Errorf("LookupNetIP(%s, %s) = %v, %v; want a not-found DNSError", tt.network, tt.host, got, err)
		}
	}
}

func TestStopsAtCleanup(t *testing.T) {
	var addr string
	t.Run("serve", func(t *testing.T) {
		addr = Start(t, map[string][]netip.Addr{"a.test": {netip.MustParseAddr("192.31.196.1")}})
	})
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("TCP %s still accepts after cleanup", addr)
	}
}

func TestIgnoresGarbage(t *testing.T) {
	addr := Start(t, map[string][]netip.Addr{"a.test": {netip.MustParseAddr("192.31.196.1")}})
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, junk := range [][]byte{{}, {1}, []byte("not a dns message at all")} {
		c.Write(junk)
	}
	tc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tc.Write([]byte{0, 3, 1, 2, 3})
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := tc.Read(make([]byte, 10)); err == nil {
		t.Errorf("TCP garbage got %d bytes back, want the connection closed", n)
	}
	tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := resolver(addr, false).LookupNetIP(ctx, "ip4", "a.test"); err != nil || len(got) != 1 {
		t.Errorf("after garbage, LookupNetIP = %v, %v; want one address", got, err)
	}
}
