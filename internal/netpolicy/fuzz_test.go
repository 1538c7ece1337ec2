package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

// FuzzPolicy: any allow and deny entry is accepted or refused, never a
// panic; for an accepted policy, every decision has a reason, a host that a
// denied entry names exactly (with no port) is refused on every port, a
// name refused by CheckHost is refused by CheckName on every port, and an
// address that is not public is refused unless an allowed entry with the
// port names it.
func FuzzPolicy(f *testing.F) {
	f.Add("api.example.com", "evil.example.com", "api.example.com", "93.184.215.14", 443)
	f.Add("*.example.com:8443", "x.example.com", "y.example.com", "10.0.0.1", 8443)
	f.Add("127.0.0.1:8080", "", "127.0.0.1", "127.0.0.1", 8080)
	f.Add("[::1]:3000", "*.internal", "host.agentconnect.internal", "::ffff:127.0.0.1", 3000)
	f.Add("*", "*.", "xn--bcher-kva.example", "169.254.169.254", 80)
	f.Add("a..b", "-x.com", "EXAMPLE.com.", "2002:7f00:1::", 0)
	f.Fuzz(func(t *testing.T, allow, deny, host, addr string, port int) {
		var allowed, denied []string
		if allow != "" {
			allowed = []string{allow}
		}
		if deny != "" {
			denied = []string{deny}
		}
		p, err := New(allowed, denied)
		if err != nil {
			return
		}
		port = port & 0xffff
		byName := p.CheckName(host, port)
		byHost := p.CheckHost(host)
		for _, d := range []Decision{byName, byHost} {
			if d.Reason == "" {
				t.Fatalf("a decision on %q:%d without a reason", host, port)
			}
		}
		if !byHost.Allow && byName.Allow && !strings.Contains(deny, ":") {
			t.Fatalf("%q refused by CheckHost (%s) but allowed on port %d (%s)", host, byHost.Reason, port, byName.Reason)
		}
		if deny != "" && !strings.ContainsAny(deny, ":*") && strings.EqualFold(strings.TrimSuffix(deny, "."), strings.TrimSuffix(host, ".")) && byName.Allow {
			t.Fatalf("%q allowed on %d though denied by %q", host, port, deny)
		}
		ip, err := netip.ParseAddr(addr)
		if err != nil {
			return
		}
		d := p.CheckAddr(host, ip, port)
		if d.Reason == "" {
			t.Fatalf("a decision on %s without a reason", ip)
		}
		if d.Allow && Classify(ip) != "" && (allow == "" || !strings.Contains(allow, ":")) {
			t.Fatalf("%s (%s) allowed for %q:%d with no allowed entry naming a port: %s", ip, Classify(ip), host, port, d.Reason)
		}
	})
}
