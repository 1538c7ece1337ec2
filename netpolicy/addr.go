package netpolicy

import "net/netip"

// special lists the address ranges that are not public, most specific first.
// Everything else (the IPv4 documentation ranges included) counts as public.
var special = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/32"), "unspecified address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network address"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT address"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback address"},
	{netip.MustParsePrefix("169.254.169.254/32"), "cloud metadata address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local address"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast address"},
	{netip.MustParsePrefix("255.255.255.255/32"), "broadcast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved address"},

	{netip.MustParsePrefix("::/128"), "unspecified address"},
	{netip.MustParsePrefix("::1/128"), "loopback address"},
	{netip.MustParsePrefix("::/96"), "IPv4-compatible address"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "cloud metadata address"},
	{netip.MustParsePrefix("fc00::/7"), "private address"},
	{netip.MustParsePrefix("fe80::/10"), "link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "multicast address"},
}

// nat64 is the well-known NAT64 prefix (RFC 6052): its last 32 bits are an
// IPv4 address that a NAT64 gateway would reach.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// Classify says what kind of non-public address ip is ("loopback address",
// "private address", "cloud metadata address", ...), or "" when ip is public.
// IPv4-mapped and NAT64 forms are judged by the IPv4 address they carry.
func Classify(ip netip.Addr) string {
	ip = ip.WithZone("")
	if ip.Is4In6() {
		if c := Classify(ip.Unmap()); c != "" {
			return c + " (IPv4-mapped)"
		}
		return ""
	}
	if nat64.Contains(ip) {
		b := ip.As16()
		if c := Classify(netip.AddrFrom4([4]byte(b[12:]))); c != "" {
			return c + " (NAT64)"
		}
		return ""
	}
	for _, s := range special {
		if s.prefix.Contains(ip) {
			return s.class
		}
	}
	if !ip.IsValid() {
		return "invalid address"
	}
	return ""
}
