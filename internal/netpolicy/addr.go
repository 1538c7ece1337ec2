package netpolicy

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// addrRange is one row of special: class says why the range is refused, or
// is "" for a range that counts as public.
type addrRange struct {
	prefix netip.Prefix
	class  string
}

func rng(prefix, class string) addrRange {
	return addrRange{netip.MustParsePrefix(prefix), class}
}

// special goes through the IANA IPv4 and IPv6 Special-Purpose Address
// Registries (and the multicast and reserved blocks): every range that is not
// globally reachable, or that leads back to the host or into a local network,
// is refused. The first row that contains an address decides, so more
// specific rows come first. Rows with an empty class are public on purpose:
// the globally reachable assignments inside refused blocks. Ranges the registries mark globally reachable and that no
// row covers (AS112 192.31.196.0/24, 192.175.48.0/24, 2620:4f:8000::/48, AMT
// 192.52.193.0/24) are public like any other address.
var special = []addrRange{
	rng("0.0.0.0/32", "unspecified address"),
	rng("0.0.0.0/8", "this-network address"),
	rng("10.0.0.0/8", "private address"),
	rng("100.64.0.0/10", "carrier-grade NAT address"),
	rng("127.0.0.0/8", "loopback address"),
	rng("169.254.169.254/32", "cloud metadata address"),
	rng("169.254.0.0/16", "link-local address"),
	rng("172.16.0.0/12", "private address"),
	// DS-Lite, the PCP and TURN anycast servers and NAT64 discovery: all
	// served by the local access network, not the internet.
	rng("192.0.0.0/24", "IETF protocol assignment address"),
	// Documentation ranges route nowhere on the internet, so what answers
	// there is a local network's: some use one as their LAN.
	rng("192.0.2.0/24", "documentation address"), // TEST-NET-1
	// RFC 7526 deprecated the relays; what still answers is some operator's
	// box, not a destination anyone means.
	rng("192.88.99.0/24", "6to4 relay anycast address"),
	rng("192.168.0.0/16", "private address"),
	// Test networks, and the "fake IP" range that VPN and proxy clients
	// answer names with on the local machine.
	rng("198.18.0.0/15", "benchmarking address"),
	rng("198.51.100.0/24", "documentation address"), // TEST-NET-2
	rng("203.0.113.0/24", "documentation address"),  // TEST-NET-3
	rng("224.0.0.0/4", "multicast address"),
	rng("255.255.255.255/32", "broadcast address"),
	rng("240.0.0.0/4", "reserved address"),

	// IPv4-mapped (::ffff:0:0/96) and NAT64 (64:ff9b::/96) addresses never
	// get here: Classify judges them by the IPv4 address they carry.
	rng("::/128", "unspecified address"),
	rng("::1/128", "loopback address"),
	rng("::/96", "IPv4-compatible address"),
	// RFC 8215: a NAT64 prefix of the local network, whose translator
	// reaches whatever IPv4 network it is given.
	rng("64:ff9b:1::/48", "local-use NAT64 address"),
	rng("100::/64", "discard-only address"),
	rng("100:0:0:1::/64", "dummy address"),
	rng("2001:db8::/32", "documentation address"),
	rng("2001:3::/32", ""),             // AMT, globally reachable
	rng("2001:4:112::/48", ""),         // AS112, globally reachable
	rng("2001:20::/28", ""),            // ORCHIDv2, globally reachable
	rng("2001:30::/28", ""),            // drone remote ID, globally reachable
	rng("2001::/32", "Teredo address"), // tunnels to the IPv4 addresses it embeds
	rng("2001:2::/48", "benchmarking address"),
	// The rest of 2001::/23: PCP, TURN and DNS-SD anycast (local servers),
	// deprecated ORCHID, unassigned.
	rng("2001::/23", "IETF protocol assignment address"),
	rng("2002::/16", "6to4 address"), // tunnels to the IPv4 address it embeds
	rng("3fff::/20", "documentation address"),
	rng("5f00::/16", "segment routing address"),
	rng("fd00:ec2::254/128", "cloud metadata address"),
	rng("fc00::/7", "private address"),
	rng("fe80::/10", "link-local address"),
	rng("fec0::/10", "site-local address"),
	rng("ff00::/8", "multicast address"),
}

var (
	// nat64 is the well-known NAT64 prefix (RFC 6052): its last 32 bits are
	// an IPv4 address that a NAT64 gateway would reach.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
	// globalUnicast is the only IPv6 block allocated for global unicast;
	// the rest of the space is reserved.
	globalUnicast = netip.MustParsePrefix("2000::/3")
)

// Classify says what kind of non-public address ip is ("loopback address",
// "private address", "cloud metadata address", ...), or "" when ip is public.
// IPv4-mapped and NAT64 forms are judged by the IPv4 address they carry.
// Classify looks at the address alone: CheckAddr also refuses the host's own
// addresses.
func Classify(ip netip.Addr) string {
	ip = ip.WithZone("")
	if !ip.IsValid() {
		return "invalid address"
	}
	if v4, how := embeddedIPv4(ip); how != "" {
		if c := Classify(v4); c != "" {
			return c + " (" + how + ")"
		}
		return ""
	}
	for _, s := range special {
		if s.prefix.Contains(ip) {
			return s.class
		}
	}
	if ip.Is6() && !globalUnicast.Contains(ip) {
		return "reserved address"
	}
	return ""
}

// embeddedIPv4 returns the IPv4 address that an IPv4-mapped or NAT64 address
// stands for, and which form it is; how is "" for any other address.
func embeddedIPv4(ip netip.Addr) (v4 netip.Addr, how string) {
	switch {
	case ip.Is4In6():
		return ip.Unmap(), "IPv4-mapped"
	case nat64.Contains(ip):
		b := ip.As16()
		return netip.AddrFrom4([4]byte(b[12:])), "NAT64"
	}
	return netip.Addr{}, ""
}

// hostAddrTTL is how long the list of the host's interface addresses is
// reused. Listing costs a netlink dump, which every checked connection would
// otherwise pay; the price is that an address added to an interface may
// pass as public for up to this long after it appears.
const hostAddrTTL = time.Second

// hostAddrs caches the addresses of this host's interfaces, as seen from the
// calling process's network namespace: where the srt proxy and the VM
// network dial from.
var hostAddrs = &addrCache{list: interfaceAddrs}

type addrCache struct {
	list func() ([]netip.Addr, error)

	mu     sync.Mutex // guards the fields that follow
	listed time.Time  // zero: never, or invalidated
	addrs  map[netip.Addr]bool
}

// has reports whether ip is one of the host's addresses (IPv4-mapped and
// NAT64 forms by the IPv4 address they carry).
func (c *addrCache) has(ip netip.Addr) (bool, error) {
	ip = ip.WithZone("")
	if v4, how := embeddedIPv4(ip); how != "" {
		ip = v4
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); c.listed.IsZero() || now.Sub(c.listed) >= hostAddrTTL {
		list, err := c.list()
		if err != nil {
			c.listed = time.Time{}
			return false, err
		}
		c.addrs = make(map[netip.Addr]bool, len(list))
		for _, a := range list {
			c.addrs[a] = true
		}
		c.listed = now
	}
	return c.addrs[ip], nil
}

// interfaceAddrs lists the addresses of every interface, unmapped and
// without zones.
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list this host's interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		var ip net.IP
		switch a := a.(type) {
		case *net.IPNet:
			ip = a.IP
		case *net.IPAddr:
			ip = a.IP
		}
		if na, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, na.Unmap())
		}
	}
	return out, nil
}

// hostClass is the class of an address that Classify found public but that
// belongs to this host, "" for one that does not.
func hostClass(ip netip.Addr) string {
	own, err := hostAddrs.has(ip)
	switch {
	case err != nil:
		// Fail closed: without the list, any address may be the host's.
		return fmt.Sprintf("address not checked against this host's own (%v)", err)
	case own:
		return "address of this host"
	}
	return ""
}
