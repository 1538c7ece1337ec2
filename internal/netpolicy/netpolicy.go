// Package netpolicy decides which network destinations a sandboxed agent may reach.
//
// A Policy is built from an agent's allowedDomains and deniedDomains. Each
// entry is a host name ("example.com"), a wildcard ("*.example.com", which
// matches subdomains only, not the bare name) or an IP literal, each with an
// optional ":port" ("[::1]:443" for an IPv6 literal with a port). Matching is
// case-insensitive and ignores a trailing dot.
//
// A destination is checked twice: by name before resolution (CheckName), then
// each resolved address (CheckAddr). Denied entries always win. Addresses that
// are not public are refused unless an allowed entry with a port names exactly
// that host or address and that port: every range of the IANA special-purpose
// registries that is not globally reachable or leads back into a local network
// (loopback, private, link-local, cloud metadata, CGNAT, benchmarking,
// reserved, multicast, 6to4, Teredo, local-use NAT64, ...), IPv4-mapped and
// NAT64 forms by the IPv4 address they carry, and the addresses of this host's
// own interfaces.
package netpolicy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Policy is an immutable, parsed network policy; it is safe for concurrent
// use. A nil *Policy behaves like New(nil, nil): every name passes and only
// public addresses are reachable.
type Policy struct {
	allowed []entry
	denied  []entry
}

// HostName names the host's loopback inside srt (through its proxy) and
// microsandbox (through the VM's network): a policy opens it per port with
// a "127.0.0.1:PORT" entry, or a "host.agentconnect.internal:PORT" one.
const HostName = "host.agentconnect.internal"

// IsHostName reports whether host is HostName (any case, a trailing dot).
func IsHostName(host string) bool {
	return strings.EqualFold(strings.TrimSuffix(host, "."), HostName)
}

// Decision is the outcome of a check. Reason names the rule that decided, in
// words a user can act on.
type Decision struct {
	Allow  bool
	Reason string
}

type entryKind int

const (
	kindName     entryKind = iota // exact host name
	kindWildcard                  // *.suffix: subdomains of suffix only
	kindIP                        // IP literal
)

// entry is one parsed allowedDomains or deniedDomains item.
type entry struct {
	raw  string // as written, for reasons
	kind entryKind
	name string     // kindName: the name; kindWildcard: the suffix without "*."
	ip   netip.Addr // kindIP, unmapped, without zone
	port int        // 0: any port
}

// New parses the allowed and denied entries. A bad entry is an error that
// names it.
func New(allowed, denied []string) (*Policy, error) {
	p := &Policy{}
	for _, s := range allowed {
		e, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("allowedDomains entry %q: %w", s, err)
		}
		p.allowed = append(p.allowed, e)
	}
	for _, s := range denied {
		e, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("deniedDomains entry %q: %w", s, err)
		}
		p.denied = append(p.denied, e)
	}
	return p, nil
}

func parseEntry(s string) (entry, error) {
	e := entry{raw: s}
	host := strings.TrimSpace(s)
	if host == "" {
		return e, fmt.Errorf("empty entry")
	}
	if host != s {
		return e, fmt.Errorf("leading or trailing space")
	}
	if strings.Contains(host, "://") || strings.Contains(host, "/") {
		return e, fmt.Errorf("write a host name or an IP address, not a URL or an address range")
	}
	host, port, err := splitEntryPort(host)
	if err != nil {
		return e, err
	}
	e.port = port
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return e, fmt.Errorf("an IPv6 zone is not allowed")
		}
		e.kind, e.ip = kindIP, ip.Unmap()
		return e, nil
	}
	host = strings.ToLower(host)
	if suffix, ok := strings.CutPrefix(host, "*."); ok {
		if err := checkName(suffix); err != nil {
			return e, err
		}
		e.kind, e.name = kindWildcard, strings.TrimSuffix(suffix, ".")
		return e, nil
	}
	if strings.Contains(host, "*") {
		return e, fmt.Errorf("a wildcard is only allowed as a leading \"*.\"")
	}
	if err := checkName(host); err != nil {
		return e, err
	}
	e.kind, e.name = kindName, strings.TrimSuffix(host, ".")
	return e, nil
}

// splitEntryPort splits "host:port", "[v6]:port", "[v6]", "v6" or "host".
func splitEntryPort(s string) (host string, port int, err error) {
	if rest, ok := strings.CutPrefix(s, "["); ok {
		inside, after, ok := strings.Cut(rest, "]")
		if !ok {
			return "", 0, fmt.Errorf("missing \"]\"")
		}
		if _, err := netip.ParseAddr(inside); err != nil || !strings.Contains(inside, ":") {
			return "", 0, fmt.Errorf("brackets must hold an IPv6 address")
		}
		if after == "" {
			return inside, 0, nil
		}
		p, ok := strings.CutPrefix(after, ":")
		if !ok {
			return "", 0, fmt.Errorf("unexpected %q after \"]\"", after)
		}
		port, err := parsePort(p)
		return inside, port, err
	}
	switch strings.Count(s, ":") {
	case 0:
		return s, 0, nil
	case 1:
		h, p, _ := strings.Cut(s, ":")
		port, err := parsePort(p)
		return h, port, err
	default:
		// A bare IPv6 address; with a port it must be bracketed.
		if _, err := netip.ParseAddr(s); err != nil {
			return "", 0, fmt.Errorf("not an IPv6 address (write an IPv6 address with a port as \"[::1]:443\")")
		}
		return s, 0, nil
	}
}

func parsePort(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 || s[0] == '+' {
		return 0, fmt.Errorf("port %q is not a number from 1 to 65535", s)
	}
	return n, nil
}

// checkName reports whether s (lowercase, optionally ending in one dot) is a
// usable DNS host name. Underscores are accepted; a name whose last label is
// all digits is not (it would read as an IP address in some resolvers).
func checkName(s string) error {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return fmt.Errorf("empty host name")
	}
	if len(s) > 253 {
		return fmt.Errorf("host name longer than 253 characters")
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("host name label %q must be 1 to 63 characters", l)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("host name label %q starts or ends with \"-\"", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("host name has character %q (use letters, digits, \"-\", \".\"; write international names in their xn-- form)", c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("not an IP address, and a host name cannot end in a numeric label")
	}
	return nil
}

// target is a normalized destination host: either a name or an IP.
type target struct {
	name string     // lowercase, no trailing dot; "" for an IP
	ip   netip.Addr // unmapped, zone removed; invalid for a name
}

func parseTarget(host string) (target, error) {
	h := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if ip, err := netip.ParseAddr(h); err == nil {
		return target{ip: ip.WithZone("").Unmap()}, nil
	}
	h = strings.ToLower(host)
	if err := checkName(h); err != nil {
		return target{}, err
	}
	return target{name: strings.TrimSuffix(h, ".")}, nil
}

// matchHost reports whether e names t, regardless of port.
func (e *entry) matchHost(t target) bool {
	switch e.kind {
	case kindName:
		return t.name != "" && t.name == e.name
	case kindWildcard:
		return t.name != "" && strings.HasSuffix(t.name, "."+e.name)
	case kindIP:
		return t.ip.IsValid() && t.ip == e.ip
	}
	return false
}

func (e *entry) matchPort(port int) bool { return e.port == 0 || e.port == port }

// CheckName decides on a destination before resolution. A denied entry that
// matches host and port wins; then, if the allowlist is non-empty, an allowed
// entry must match. With no allowlist every name not denied passes. host may
// be a name or an IP literal (brackets optional).
func (p *Policy) CheckName(host string, port int) Decision {
	t, err := parseTarget(host)
	if err != nil {
		return Decision{Reason: fmt.Sprintf("invalid host %q: %v", host, err)}
	}
	if p == nil {
		return Decision{Allow: true, Reason: "no allowedDomains list: every host that is not denied may be reached"}
	}
	for i := range p.denied {
		e := &p.denied[i]
		if e.matchHost(t) && e.matchPort(port) {
			return Decision{Reason: fmt.Sprintf("%s is denied by deniedDomains entry %q", hostPort(t, port), e.raw)}
		}
	}
	if len(p.allowed) == 0 {
		return Decision{Allow: true, Reason: "no allowedDomains list: every host that is not denied may be reached"}
	}
	var otherPorts []string
	for i := range p.allowed {
		e := &p.allowed[i]
		if !e.matchHost(t) {
			continue
		}
		if e.matchPort(port) {
			return Decision{Allow: true, Reason: fmt.Sprintf("allowed by allowedDomains entry %q", e.raw)}
		}
		otherPorts = append(otherPorts, strconv.Quote(e.raw))
	}
	if len(otherPorts) > 0 {
		return Decision{Reason: fmt.Sprintf("%s is not allowed: allowedDomains opens this host only on other ports (%s); add %q to allow it",
			hostPort(t, port), strings.Join(otherPorts, ", "), hostPort(t, port))}
	}
	return Decision{Reason: fmt.Sprintf("%s is not in allowedDomains; add %q (or %q for this port only) to allow it",
		t.String(), t.String(), hostPort(t, port))}
}

// CheckHost decides whether host may be reached on some port: a denied
// entry without a port that matches it refuses it, and with an allowlist an
// allowed entry must match it, on any port. A DNS server answering for a
// sandbox asks this: a name is resolved when a connection to it could be
// allowed (CheckName then decides on each connection, with its port).
func (p *Policy) CheckHost(host string) Decision {
	t, err := parseTarget(host)
	if err != nil {
		return Decision{Reason: fmt.Sprintf("invalid host %q: %v", host, err)}
	}
	if p == nil {
		return Decision{Allow: true, Reason: "no allowedDomains list: every host that is not denied may be reached"}
	}
	for i := range p.denied {
		e := &p.denied[i]
		if e.matchHost(t) && e.port == 0 {
			return Decision{Reason: fmt.Sprintf("%s is denied by deniedDomains entry %q", t.String(), e.raw)}
		}
	}
	if len(p.allowed) == 0 {
		return Decision{Allow: true, Reason: "no allowedDomains list: every host that is not denied may be reached"}
	}
	for i := range p.allowed {
		if e := &p.allowed[i]; e.matchHost(t) {
			return Decision{Allow: true, Reason: fmt.Sprintf("allowed by allowedDomains entry %q", e.raw)}
		}
	}
	return Decision{Reason: fmt.Sprintf("%s is not in allowedDomains; add %q to allow it", t.String(), t.String())}
}

// CheckAddr decides on one resolved address ip of host (call CheckName
// first; CheckAddr does not repeat it). An address that a denied IP entry
// matches is refused. An address that is not public (Classify), or that
// belongs to one of this host's interfaces, is refused unless an allowed
// entry with a port names exactly host (not through a wildcard) or ip, and
// port. Every other address passes.
func (p *Policy) CheckAddr(host string, ip netip.Addr, port int) Decision {
	if !ip.IsValid() {
		return Decision{Reason: fmt.Sprintf("%q has no valid address", host)}
	}
	addr := ip.WithZone("").Unmap()
	t, err := parseTarget(host)
	if err != nil {
		t = target{ip: addr} // judge by address alone
	}
	if p != nil {
		for i := range p.denied {
			e := &p.denied[i]
			if e.kind == kindIP && e.ip == addr && e.matchPort(port) {
				return Decision{Reason: fmt.Sprintf("%s is denied by deniedDomains entry %q", describe(t, ip, port), e.raw)}
			}
		}
	}
	class := Classify(ip)
	if class == "" {
		class = hostClass(ip)
	}
	if class == "" {
		return Decision{Allow: true, Reason: fmt.Sprintf("%s is a public address", ip)}
	}
	if p != nil {
		for i := range p.allowed {
			e := &p.allowed[i]
			if e.port != port {
				continue
			}
			if e.kind == kindName && t.name != "" && e.name == t.name || e.kind == kindIP && e.ip == addr {
				return Decision{Allow: true, Reason: fmt.Sprintf("%s (%s) is allowed by allowedDomains entry %q", describe(t, ip, port), class, e.raw)}
			}
		}
	}
	return Decision{Reason: fmt.Sprintf("%s is %s, which is refused; to allow it, add %q to allowedDomains",
		describe(t, ip, port), withArticle(class), hostPort(t, port))}
}

// describe words a destination for a reason: "name:port (resolved to ip)" or
// "ip:port".
func describe(t target, ip netip.Addr, port int) string {
	if t.name != "" {
		return fmt.Sprintf("%s (resolved to %s)", hostPort(t, port), ip)
	}
	return netip.AddrPortFrom(ip, uint16(port)).String()
}

func (t target) String() string {
	if t.name != "" {
		return t.name
	}
	if t.ip.Is6() {
		return "[" + t.ip.String() + "]"
	}
	return t.ip.String()
}

func hostPort(t target, port int) string {
	return t.String() + ":" + strconv.Itoa(port)
}

func withArticle(s string) string {
	switch s[0] | 0x20 { // lowercase ASCII
	case 'a', 'e', 'i', 'o', 'u':
		return "an " + s
	}
	return "a " + s
}
