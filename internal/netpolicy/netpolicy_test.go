package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func mustNew(t *testing.T, allowed, denied []string) *Policy {
	t.Helper()
	p, err := New(allowed, denied)
	if err != nil {
		t.Fatalf("New(%q, %q) = %v", allowed, denied, err)
	}
	return p
}

func TestNewAccepts(t *testing.T) {
	good := []string{
		"example.com", "EXAMPLE.com", "example.com.", "*.example.com", "example.com:443", "*.example.com:8080",
		"localhost", "localhost:8080", "my_host.internal", "127.0.0.1", "127.0.0.1:8080", "::1", "[::1]",
		"[::1]:443", "2620:4f:8000::1", "[2620:4f:8000::1]:80", "::ffff:10.0.0.1", "xn--bcher-kva.example",
	}
	for _, s := range good {
		if _, err := New([]string{s}, []string{s}); err != nil {
			t.Errorf("New(%q) = %v, want nil", s, err)
		}
	}
}

func TestNewRejects(t *testing.T) {
	bad := []string{
		"", " example.com", "example.com ", "example.com:", "example.com:0", "example.com:65536",
		"example.com:http", "example.com:+80", "example.com:80:90", "[::1", "[::1]x", "[::1]:", "[example.com]:80",
		"[127.0.0.1]:80", "*", "*.", "*example.com", "a.*.example.com", "*.*.example.com", "exa mple.com",
		"10.0.0.0/8", "-bad.com", "bad-.com", "foo..com", ".example.com", "1.2.3", "256.1.1.1",
		"[fe80::1%eth0]:80", "fe80::1%eth0", "bücher.example", "http://example.com",
		strings.Repeat("a", 64) + ".com", strings.Repeat("abcdefghi.", 26) + "com",
	}
	for _, s := range bad {
		_, err := New([]string{s}, nil)
		if err == nil {
			t.Errorf("New(allowed %q) = nil, want an error", s)
			continue
		}
		if want := "allowedDomains entry " + quote(s); !strings.Contains(err.Error(), want) {
			t.Errorf("New(allowed %q) = %q, want it to contain %q", s, err, want)
		}
		_, err = New(nil, []string{"ok.example", s})
		if err == nil || !strings.Contains(err.Error(), "deniedDomains entry "+quote(s)) {
			t.Errorf("New(denied %q) = %v, want an error naming the deniedDomains entry", s, err)
		}
	}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func TestCheckName(t *testing.T) {
	tests := []struct {
		name            string
		allowed, denied []string
		host            string
		port            int
		allow           bool
		reason          string // substring of Decision.Reason
	}{
		{"no lists", nil, nil, "example.com", 443, true, "no allowedDomains list"},
		{"no lists, IP", nil, nil, "192.31.196.7", 80, true, "no allowedDomains list"},
		{"exact", []string{"example.com"}, nil, "example.com", 443, true, `entry "example.com"`},
		{"exact, any port", []string{"example.com"}, nil, "example.com", 8443, true, `entry "example.com"`},
		{"case and trailing dot", []string{"Example.COM"}, nil, "EXAMPLE.com.", 443, true, `entry "Example.COM"`},
		{"exact does not open subdomain", []string{"example.com"}, nil, "www.example.com", 443, false, `www.example.com is not in allowedDomains; add "www.example.com"`},
		{"not listed", []string{"example.com"}, nil, "other.org", 443, false, `add "other.org" (or "other.org:443" for this port only)`},
		{"wildcard subdomain", []string{"*.example.com"}, nil, "www.example.com", 443, true, `entry "*.example.com"`},
		{"wildcard deep subdomain", []string{"*.example.com"}, nil, "a.b.example.com", 443, true, `entry "*.example.com"`},
		{"wildcard not bare name", []string{"*.example.com"}, nil, "example.com", 443, false, "not in allowedDomains"},
		{"wildcard not suffix of label", []string{"*.example.com"}, nil, "badexample.com", 443, false, "not in allowedDomains"},
		{"wildcard and bare", []string{"*.example.com", "example.com"}, nil, "example.com", 443, true, `entry "example.com"`},
		{"port match", []string{"example.com:443"}, nil, "example.com", 443, true, `entry "example.com:443"`},
		{"port mismatch", []string{"example.com:443"}, nil, "example.com", 80, false, `only on other ports ("example.com:443"); add "example.com:80"`},
		{"wildcard port mismatch", []string{"*.example.com:443"}, nil, "api.example.com", 80, false, "only on other ports"},
		{"denied without allowlist", nil, []string{"*.evil.test"}, "x.evil.test", 443, false, `x.evil.test:443 is denied by deniedDomains entry "*.evil.test"`},
		{"denied wildcard spares bare name", nil, []string{"*.evil.test"}, "evil.test", 443, true, "no allowedDomains list"},
		{"deny wins over allow", []string{"*.example.com"}, []string{"bad.example.com"}, "bad.example.com", 443, false, `denied by deniedDomains entry "bad.example.com"`},
		{"deny leaves others", []string{"*.example.com"}, []string{"bad.example.com"}, "good.example.com", 443, true, `entry "*.example.com"`},
		{"deny wins over same entry", []string{"example.com"}, []string{"example.com"}, "example.com", 443, false, "denied"},
		{"denied port", nil, []string{"example.com:80"}, "example.com", 80, false, `denied by deniedDomains entry "example.com:80"`},
		{"denied other port", nil, []string{"example.com:80"}, "example.com", 443, true, "no allowedDomains list"},
		{"denied trailing dot", nil, []string{"evil.test"}, "EVIL.test.", 443, false, "denied"},
		{"IP allowed", []string{"192.31.196.7"}, nil, "192.31.196.7", 443, true, `entry "192.31.196.7"`},
		{"IP not allowed", []string{"192.31.196.7"}, nil, "192.31.196.8", 443, false, `192.31.196.8 is not in allowedDomains`},
		{"mapped IP matches IPv4 entry", []string{"192.31.196.7"}, nil, "::ffff:192.31.196.7", 443, true, `entry "192.31.196.7"`},
		{"mapped IP denied by IPv4 entry", nil, []string{"192.31.196.7"}, "[::ffff:192.31.196.7]", 443, false, "denied"},
		{"IPv6 with port", []string{"[2620:4f:8000::1]:443"}, nil, "[2620:4f:8000::1]", 443, true, `entry "[2620:4f:8000::1]:443"`},
		{"IPv6 port mismatch", []string{"[2620:4f:8000::1]:443"}, nil, "2620:4f:8000::1", 80, false, `add "[2620:4f:8000::1]:80"`},
		{"IPv6 spelled differently", []string{"2620:4F:8000:0::1"}, nil, "2620:4f:8000::1", 80, true, "allowed"},
		{"name entry does not match IP", []string{"example.com"}, nil, "192.31.196.7", 443, false, "not in allowedDomains"},
		{"IP entry does not match name", []string{"192.31.196.7"}, nil, "example.com", 443, false, "not in allowedDomains"},
		{"invalid host", nil, nil, "exa mple.com", 443, false, "invalid host"},
		{"empty host", nil, nil, "", 443, false, "invalid host"},
		{"numeric-looking name", nil, nil, "127.1", 443, false, "invalid host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, tt.allowed, tt.denied)
			d := p.CheckName(tt.host, tt.port)
			if d.Allow != tt.allow || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("CheckName(%q, %d) = %+v, want Allow %v and a reason containing %q", tt.host, tt.port, d, tt.allow, tt.reason)
			}
		})
	}
}

func TestCheckAddrClasses(t *testing.T) {
	tests := []struct {
		ip    string
		class string // "" for public
	}{
		{"192.31.196.7", ""},
		{"192.0.2.1", "documentation address"},
		{"203.0.113.5", "documentation address"},
		{"198.51.100.7", "documentation address"},
		{"2001:db8::1", "documentation address"},
		{"::ffff:198.51.100.7", "documentation address (IPv4-mapped)"},
		{"64:ff9b::c633:6407", "documentation address (NAT64)"}, // NAT64 of 198.51.100.7
		{"8.8.8.8", ""},
		{"172.32.0.1", ""},
		{"100.128.0.1", ""},
		{"2620:4f:8000::1", ""},
		{"2606:4700::1111", ""},
		{"::ffff:192.31.196.7", ""},
		{"64:ff9b::c01f:c407", ""}, // NAT64 of 192.31.196.7
		{"127.0.0.1", "loopback address"},
		{"127.255.255.254", "loopback address"},
		{"10.1.2.3", "private address"},
		{"172.16.0.1", "private address"},
		{"172.31.255.255", "private address"},
		{"192.168.1.1", "private address"},
		{"169.254.1.1", "link-local address"},
		{"169.254.169.254", "cloud metadata address"},
		{"100.64.0.1", "carrier-grade NAT address"},
		{"100.127.255.255", "carrier-grade NAT address"},
		{"0.0.0.0", "unspecified address"},
		{"0.1.2.3", "this-network address"},
		{"224.0.0.1", "multicast address"},
		{"239.255.255.250", "multicast address"},
		{"255.255.255.255", "broadcast address"},
		{"240.0.0.1", "reserved address"},
		{"::", "unspecified address"},
		{"::1", "loopback address"},
		{"fe80::1", "link-local address"},
		{"fe80::1%eth0", "link-local address"},
		{"fc00::1", "private address"},
		{"fd12:3456::1", "private address"},
		{"fd00:ec2::254", "cloud metadata address"},
		{"ff02::1", "multicast address"},
		{"::ffff:127.0.0.1", "loopback address (IPv4-mapped)"},
		{"::ffff:10.0.0.1", "private address (IPv4-mapped)"},
		{"::ffff:169.254.169.254", "cloud metadata address (IPv4-mapped)"},
		{"::ffff:0.0.0.0", "unspecified address (IPv4-mapped)"},
		{"64:ff9b::7f00:1", "loopback address (NAT64)"},
		{"::127.0.0.1", "IPv4-compatible address"},
	}
	p := mustNew(t, nil, nil)
	for _, tt := range tests {
		ip := netip.MustParseAddr(tt.ip)
		if got := Classify(ip); got != tt.class {
			t.Errorf("Classify(%s) = %q, want %q", tt.ip, got, tt.class)
		}
		d := p.CheckAddr("example.com", ip, 443)
		if d.Allow != (tt.class == "") {
			t.Errorf("CheckAddr(example.com, %s, 443) = %+v, want Allow %v", tt.ip, d, tt.class == "")
		}
		if tt.class != "" && (!strings.Contains(d.Reason, tt.class) || !strings.Contains(d.Reason, ip.String())) {
			t.Errorf("CheckAddr(example.com, %s, 443).Reason = %q, want it to name %q and the address", tt.ip, d.Reason, tt.class)
		}
	}
}

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		name            string
		allowed, denied []string
		host, ip        string
		port            int
		allow           bool
		reason          string
	}{
		{"public", []string{"example.com"}, nil, "example.com", "192.31.196.7", 443, true, "192.31.196.7 is a public address"},
		{"public name to loopback", []string{"example.com"}, nil, "example.com", "127.0.0.1", 80, false,
			`example.com:80 (resolved to 127.0.0.1) is a loopback address, which is refused; to allow it, add "example.com:80" to allowedDomains`},
		{"no lists, name to loopback", nil, nil, "sneaky.test", "127.0.0.1", 80, false, "resolved to 127.0.0.1"},
		{"name:port opens loopback", []string{"example.com:8080"}, nil, "example.com", "127.0.0.1", 8080, true, `allowed by allowedDomains entry "example.com:8080"`},
		{"name:port, other port", []string{"example.com:8080"}, nil, "example.com", "127.0.0.1", 8081, false, "loopback"},
		{"name:port, case and dot", []string{"Example.com:8080"}, nil, "EXAMPLE.COM.", "127.0.0.1", 8080, true, "allowed"},
		{"name without port does not open", []string{"example.com"}, nil, "example.com", "10.0.0.1", 443, false, "private address"},
		{"wildcard never opens", []string{"*.example.com:8080"}, nil, "dev.example.com", "127.0.0.1", 8080, false, "loopback"},
		{"other name's entry does not open", []string{"other.test:8080"}, nil, "example.com", "127.0.0.1", 8080, false, "loopback"},
		{"localhost:8080", []string{"localhost:8080"}, nil, "localhost", "127.0.0.1", 8080, true, "allowed"},
		{"localhost:8080 IPv6", []string{"localhost:8080"}, nil, "localhost", "::1", 8080, true, "allowed"},
		{"localhost:8080 other port", []string{"localhost:8080"}, nil, "localhost", "127.0.0.1", 8081, false, `add "localhost:8081"`},
		{"IP entry opens literal", []string{"127.0.0.1:8080"}, nil, "127.0.0.1", "127.0.0.1", 8080, true, `entry "127.0.0.1:8080"`},
		{"IP entry opens resolved", []string{"127.0.0.1:8080"}, nil, "foo.test", "127.0.0.1", 8080, true, `entry "127.0.0.1:8080"`},
		{"IP entry opens mapped", []string{"127.0.0.1:8080"}, nil, "::ffff:127.0.0.1", "::ffff:127.0.0.1", 8080, true, "allowed"},
		{"IP entry, other address", []string{"127.0.0.1:8080"}, nil, "127.0.0.2", "127.0.0.2", 8080, false, `add "127.0.0.2:8080"`},
		{"IP entry without port", []string{"127.0.0.1"}, nil, "127.0.0.1", "127.0.0.1", 8080, false, "loopback"},
		{"IPv6 entry", []string{"[::1]:443"}, nil, "::1", "::1", 443, true, `entry "[::1]:443"`},
		{"IPv6 entry other port", []string{"[::1]:443"}, nil, "::1", "::1", 80, false, `add "[::1]:80"`},
		{"metadata", nil, nil, "metadata.google.internal", "169.254.169.254", 80, false, "cloud metadata address"},
		{"metadata mapped", nil, nil, "x.test", "::ffff:169.254.169.254", 80, false, "cloud metadata address (IPv4-mapped)"},
		{"denied IP on resolved address", nil, []string{"192.31.196.9"}, "good.test", "192.31.196.9", 443, false, `denied by deniedDomains entry "192.31.196.9"`},
		{"denied IP on mapped address", nil, []string{"192.31.196.9"}, "good.test", "::ffff:192.31.196.9", 443, false, "denied"},
		{"denied IP other port", nil, []string{"192.31.196.9:80"}, "good.test", "192.31.196.9", 443, true, "public"},
		{"deny wins over explicit allow", []string{"127.0.0.1:8080"}, []string{"127.0.0.1"}, "127.0.0.1", "127.0.0.1", 8080, false, "denied"},
		{"bad host judged by address", []string{"127.0.0.1:8080"}, nil, "", "127.0.0.1", 8080, true, "allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, tt.allowed, tt.denied)
			d := p.CheckAddr(tt.host, netip.MustParseAddr(tt.ip), tt.port)
			if d.Allow != tt.allow || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("CheckAddr(%q, %s, %d) = %+v, want Allow %v and a reason containing %q", tt.host, tt.ip, tt.port, d, tt.allow, tt.reason)
			}
		})
	}
}

func TestNilPolicy(t *testing.T) {
	var p *Policy
	if d := p.CheckName("example.com", 443); !d.Allow {
		t.Errorf("nil CheckName = %+v, want allowed", d)
	}
	if d := p.CheckAddr("example.com", netip.MustParseAddr("192.31.196.7"), 443); !d.Allow {
		t.Errorf("nil CheckAddr(public) = %+v, want allowed", d)
	}
	if d := p.CheckAddr("example.com", netip.MustParseAddr("127.0.0.1"), 443); d.Allow {
		t.Errorf("nil CheckAddr(loopback) = %+v, want refused", d)
	}
	if d := p.CheckAddr("example.com", netip.Addr{}, 443); d.Allow {
		t.Errorf("CheckAddr(invalid address) = %+v, want refused", d)
	}
}

func TestCheckHost(t *testing.T) {
	p, err := New([]string{"api.example:443", "*.cdn.example"}, []string{"bad.example", "api.example:80"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host  string
		allow bool
	}{
		{"api.example", true}, // allowed on 443: resolvable
		{"x.cdn.example", true},
		{"cdn.example", false}, // a wildcard does not match the bare name
		{"bad.example", false}, // denied on every port
		{"other.example", false},
	} {
		if d := p.CheckHost(tc.host); d.Allow != tc.allow || d.Reason == "" {
			t.Errorf("CheckHost(%q) = %+v, want allow %v with a reason", tc.host, d, tc.allow)
		}
	}
	if d := (*Policy)(nil).CheckHost("anything.example"); !d.Allow {
		t.Errorf("nil policy: %+v", d)
	}
	open, _ := New(nil, []string{"bad.example:443"})
	if d := open.CheckHost("bad.example"); !d.Allow {
		t.Errorf("a name denied on one port only is resolvable: %+v", d)
	}
}

// TestClassifyRegistries has a row for each range of the IANA IPv4 and IPv6
// Special-Purpose Address Registries (and the multicast and reserved
// blocks): an address inside it, and for the refused ones the addresses just
// outside, which must not be caught by it.
func TestClassifyRegistries(t *testing.T) {
	tests := []struct {
		ip, class string
	}{
		// IPv4
		{"0.0.0.0", "unspecified address"},
		{"0.255.255.255", "this-network address"},
		{"1.0.0.0", ""},
		{"10.0.0.0", "private address"},
		{"10.255.255.255", "private address"},
		{"9.255.255.255", ""},
		{"11.0.0.0", ""},
		{"100.63.255.255", ""},
		{"100.64.0.0", "carrier-grade NAT address"},
		{"100.128.0.0", ""},
		{"126.255.255.255", ""},
		{"127.0.0.1", "loopback address"},
		{"128.0.0.0", ""},
		{"169.254.0.1", "link-local address"},
		{"169.254.169.254", "cloud metadata address"},
		{"169.253.255.255", ""},
		{"169.255.0.0", ""},
		{"172.15.255.255", ""},
		{"172.16.0.0", "private address"},
		{"172.32.0.0", ""},
		{"191.255.255.255", ""},
		{"192.0.0.0", "IETF protocol assignment address"},
		{"192.0.0.8", "IETF protocol assignment address"},   // IPv4 dummy address
		{"192.0.0.9", "IETF protocol assignment address"},   // PCP anycast
		{"192.0.0.10", "IETF protocol assignment address"},  // TURN anycast
		{"192.0.0.170", "IETF protocol assignment address"}, // NAT64/DNS64 discovery
		{"192.0.0.255", "IETF protocol assignment address"},
		{"192.0.1.0", ""},
		{"192.0.2.1", "documentation address"}, // TEST-NET-1
		{"192.31.196.1", ""},                   // AS112
		{"192.52.193.1", ""},                   // AMT
		{"192.88.98.255", ""},                  // just below the 6to4 relays
		{"192.88.99.1", "6to4 relay anycast address"},
		{"192.88.100.0", ""},
		{"192.167.255.255", ""},
		{"192.168.0.0", "private address"},
		{"192.169.0.0", ""},
		{"192.175.48.1", ""}, // AS112 direct delegation
		{"198.17.255.255", ""},
		{"198.18.0.0", "benchmarking address"},
		{"198.19.255.255", "benchmarking address"},
		{"198.20.0.0", ""},
		{"192.31.196.1", ""},
		{"198.51.100.1", "documentation address"},
		{"203.0.113.1", "documentation address"},
		{"223.255.255.255", ""},
		{"224.0.0.0", "multicast address"},
		{"239.255.255.255", "multicast address"},
		{"240.0.0.0", "reserved address"},
		{"255.255.255.254", "reserved address"},
		{"255.255.255.255", "broadcast address"},

		// IPv6
		{"::", "unspecified address"},
		{"::1", "loopback address"},
		{"::2", "IPv4-compatible address"},
		{"::ffff:8.8.8.8", ""},
		{"::ffff:198.18.0.1", "benchmarking address (IPv4-mapped)"},
		{"::ffff:192.0.0.9", "IETF protocol assignment address (IPv4-mapped)"},
		{"64:ff9b::808:808", ""}, // NAT64 of 8.8.8.8
		{"64:ff9b::a00:1", "private address (NAT64)"},
		{"64:ff9b::c612:1", "benchmarking address (NAT64)"},
		{"64:ff9b::1:0:0", "reserved address"}, // outside both NAT64 prefixes
		{"64:ff9b:1::", "local-use NAT64 address"},
		{"64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "local-use NAT64 address"},
		{"64:ff9b:1::808:808", "local-use NAT64 address"}, // even with a public IPv4 inside
		{"64:ff9b:2::", "reserved address"},
		{"100::1", "discard-only address"},
		{"100:0:0:1::1", "dummy address"},
		{"100:0:0:2::", "reserved address"},
		{"2001::1", "Teredo address"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo address"},
		{"2001:1::1", "IETF protocol assignment address"}, // PCP anycast
		{"2001:1::2", "IETF protocol assignment address"}, // TURN anycast
		{"2001:1::3", "IETF protocol assignment address"}, // DNS-SD SRP anycast
		{"2001:2::1", "benchmarking address"},
		{"2001:2:1::", "IETF protocol assignment address"},
		{"2001:3::1", ""},     // AMT
		{"2001:4:112::1", ""}, // AS112
		{"2001:4:113::1", "IETF protocol assignment address"},
		{"2001:10::1", "IETF protocol assignment address"}, // deprecated ORCHID
		{"2001:20::1", ""},                                 // ORCHIDv2
		{"2001:30::1", ""},                                 // drone remote ID
		{"2001:40::1", "IETF protocol assignment address"},
		{"2001:1ff:ffff::", "IETF protocol assignment address"},
		{"2001:200::1", ""},     // first address after 2001::/23
		{"2620:4f:8000::1", ""}, // documentation counts as public
		{"2002::1", "6to4 address"},
		{"2002:c0a8:101::1", "6to4 address"}, // 6to4 of 192.168.1.1
		{"2002:808:808::1", "6to4 address"},  // even with a public IPv4 inside
		{"2003::1", ""},
		{"2620:4f:8000::1", ""}, // AS112 direct delegation
		{"3fff::1", "documentation address"},
		{"3fff:fff::1", "documentation address"},
		{"3fff:1000::1", ""},
		{"5f00::1", "segment routing address"},
		{"5eff:ffff::1", "reserved address"},
		{"4000::1", "reserved address"},
		{"1000::1", "reserved address"},
		{"e000::1", "reserved address"},
		{"fc00::1", "private address"},
		{"fd00:ec2::254", "cloud metadata address"},
		{"fe80::1", "link-local address"},
		{"fec0::1", "site-local address"},
		{"ff02::1", "multicast address"},
	}
	for _, tt := range tests {
		if got := Classify(netip.MustParseAddr(tt.ip)); got != tt.class {
			t.Errorf("Classify(%s) = %q, want %q", tt.ip, got, tt.class)
		}
	}
}

// TestHostAddressRefused puts an address from a range that counts as public
// on a veth interface in a network namespace of the test's own, and checks
// from there that the policy refuses it as the host's (the proxy and the VM
// network dial from the host's namespace), that an explicit entry opens it,
// and that a neighbour on the same subnet stays public.
func TestHostAddressRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed (make deps installs it)")
	}
	ns := fmt.Sprintf("acnp%d", os.Getpid()%100000)
	ipCmd := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ipCmd("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	ipCmd("-n", ns, "link", "add", "acveth0", "type", "veth", "peer", "name", "acveth1")
	ipCmd("-n", ns, "addr", "add", "192.31.196.77/24", "dev", "acveth0")
	ipCmd("-n", ns, "addr", "add", "2620:4f:8000::77/64", "dev", "acveth0", "nodad")

	type check struct {
		allowed []string
		ip      string
		allow   bool
		reason  string
	}
	checks := []check{
		{nil, "192.31.196.77", false, "192.31.196.77:8080 is an address of this host, which is refused; to allow it, add \"192.31.196.77:8080\""},
		{nil, "::ffff:192.31.196.77", false, "address of this host"},
		{nil, "64:ff9b::c01f:c44d", false, "address of this host"}, // NAT64 of 192.31.196.77
		{nil, "2620:4f:8000::77", false, "address of this host"},
		{nil, "192.31.196.78", true, "public"},
		{nil, "2620:4f:8000::78", true, "public"},
		{[]string{"192.31.196.77:8080"}, "192.31.196.77", true, "(address of this host) is allowed by allowedDomains entry \"192.31.196.77:8080\""},
		{[]string{"192.31.196.77:8081"}, "192.31.196.77", false, "address of this host"},
	}
	results := make(chan []Decision)
	go func() {
		// This goroutine's thread moves to the test's namespace and is never
		// unlocked: it ends with the goroutine instead of going back to the
		// pool in the wrong namespace.
		runtime.LockOSThread()
		var out []Decision
		defer func() { results <- out }()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			t.Errorf("enter %s: %v", ns, err)
			return
		}
		invalidateHostAddrs()
		defer invalidateHostAddrs() // the next check lists the test's own namespace again
		for _, c := range checks {
			p, err := New(c.allowed, nil)
			if err != nil {
				t.Error(err)
				return
			}
			out = append(out, p.CheckAddr(c.ip, netip.MustParseAddr(c.ip), 8080))
		}
	}()
	got := <-results
	if len(got) != len(checks) {
		t.Fatalf("%d decisions, want %d", len(got), len(checks))
	}
	for i, c := range checks {
		if d := got[i]; d.Allow != c.allow || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("allowed %q: CheckAddr(%s, 8080) = %+v, want Allow %v and a reason containing %q", c.allowed, c.ip, d, c.allow, c.reason)
		}
	}

	// Outside the namespace the veth's address is nobody's: public.
	invalidateHostAddrs()
	if d := (*Policy)(nil).CheckAddr("192.31.196.77", netip.MustParseAddr("192.31.196.77"), 8080); !d.Allow {
		t.Errorf("192.31.196.77 in the test's own namespace: %+v, want public", d)
	}
}

// TestHostAddressesOfThisMachine checks the addresses this machine really
// has: each one is refused, whatever range it is in.
func TestHostAddressesOfThisMachine(t *testing.T) {
	addrs, err := interfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) == 0 {
		t.Skip("no interface addresses")
	}
	invalidateHostAddrs()
	for _, a := range addrs {
		if d := (*Policy)(nil).CheckAddr("h.test", a, 80); d.Allow {
			t.Errorf("CheckAddr(h.test, %s, 80) = %+v: an address of this host passed", a, d)
		}
	}
}

// TestHostAddressesUnknown: when the interfaces cannot be listed, no address
// passes as public.
func TestHostAddressesUnknown(t *testing.T) {
	saved := hostAddrs
	hostAddrs = &addrCache{list: func() ([]netip.Addr, error) {
		return nil, errors.New("list this host's interface addresses: too many open files")
	}}
	t.Cleanup(func() { hostAddrs = saved })
	d := (*Policy)(nil).CheckAddr("example.com", netip.MustParseAddr("192.31.196.7"), 443)
	if d.Allow || !strings.Contains(d.Reason, "too many open files") {
		t.Errorf("CheckAddr with no interface list = %+v, want refused with the reason", d)
	}
}

func invalidateHostAddrs() {
	hostAddrs.mu.Lock()
	hostAddrs.listed = time.Time{}
	hostAddrs.mu.Unlock()
}

// TestBinding: a host without a port binds HTTPS on 443 only; a host:port
// binds that port, plain HTTP included.
func TestBinding(t *testing.T) {
	b, err := NewBinding([]string{"api.example.com", "*.corp.example", "host.agentconnect.internal:8080", "[::1]:9000"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host       string
		port       int
		tls, plain bool
	}{
		{"api.example.com", 443, true, false},
		{"API.example.com.", 443, true, false},
		{"api.example.com", 80, false, false},
		{"api.example.com", 22, false, false},
		{"example.com", 443, false, false},
		{"git.corp.example", 443, true, false},
		{"corp.example", 443, false, false},
		{"host.agentconnect.internal", 8080, true, true},
		{"host.agentconnect.internal", 443, false, false},
		{"::1", 9000, true, true},
		{"[::1]", 9000, true, true},
		{"not a name", 443, false, false},
	} {
		if got := b.TLS(c.host, c.port); got != c.tls {
			t.Errorf("TLS(%s, %d) = %v", c.host, c.port, got)
		}
		if got := b.Plain(c.host, c.port); got != c.plain {
			t.Errorf("Plain(%s, %d) = %v", c.host, c.port, got)
		}
	}
	if _, err := NewBinding([]string{"https://x"}); err == nil {
		t.Error("a URL as a host was accepted")
	}
}
