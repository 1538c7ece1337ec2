package netpolicy

import "fmt"

// Binding is where a secret may be put on the wire: its hosts, entries as
// in a policy. A host without a port binds HTTPS on 443; a host:port binds
// that port, over HTTPS or plain HTTP (a local gateway): plain HTTP only
// where the user named the port, and no other port of a named host, so
// that SSH to a bound host, or any protocol in which the server speaks
// first, is never taken for HTTP.
type Binding struct{ entries []entry }

// NewBinding parses a secret's hosts.
func NewBinding(hosts []string) (*Binding, error) {
	b := &Binding{}
	for _, s := range hosts {
		e, err := parseEntry(s)
		if err != nil {
			return nil, fmt.Errorf("host %q: %w", s, err)
		}
		b.entries = append(b.entries, e)
	}
	return b, nil
}

// TLS reports whether HTTPS to host:port is bound.
func (b *Binding) TLS(host string, port int) bool { return b.Binds(host, port, false) }

// Plain reports whether plain HTTP to host:port is bound.
func (b *Binding) Plain(host string, port int) bool { return b.Binds(host, port, true) }

// Binds reports whether host:port is bound, over plain HTTP or HTTPS.
func (b *Binding) Binds(host string, port int, plain bool) bool {
	t, err := parseTarget(host)
	if err != nil {
		return false
	}
	for _, e := range b.entries {
		if !e.matchHost(t) {
			continue
		}
		if e.port == port || e.port == 0 && !plain && port == 443 {
			return true
		}
	}
	return false
}
