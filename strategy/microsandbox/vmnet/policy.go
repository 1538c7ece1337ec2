package vmnet

import (
	"container/list"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

const (
	// maxNamedAddrs bounds the addresses whose names are remembered;
	// the least recently used is forgotten first.
	maxNamedAddrs = 4096
	// maxNamesPerAddr bounds the names remembered for one address; the
	// oldest is forgotten first.
	maxNamesPerAddr = 8
	// maxReported bounds the remembered UDP destinations and names that
	// were already reported.
	maxReported = 1024
	// dnsReportWindow is how long a refused name is not reported again.
	dnsReportWindow = 10 * time.Second
)

// judge decides on a guest connection to dst:port. It returns the address to
// dial, or a refusal (with Protocol left for the caller to fill in).
//
//  1. HostIP stands for the host's loopback: it is judged and dialled as
//     127.0.0.1. Any other address of the VM network (the gateway itself
//     included: it serves only DNS) is refused outright, whatever the policy
//     says: the policy's addresses are the host's, not the VM network's.
//  2. The candidates are the names that this network's DNS resolved to dst
//     (most recent first), then the IP literal of the address to dial
//     (first for HostIP: "127.0.0.1" is how policies name the host).
//  3. The connection is allowed if some candidate passes both
//     CheckName(candidate, port) and CheckAddr(candidate, addr, port).
//     Otherwise the first candidate's refusal is reported.
func (n *Network) judge(dst netip.Addr, port int) (netip.AddrPort, *netpolicy.Violation) {
	dst = dst.Unmap()
	addr := dst
	switch {
	case dst == hostAddr:
		addr = loopback
	case dst == gatewayAddr:
		return netip.AddrPort{}, &netpolicy.Violation{Host: dst.String(), Port: port, Addr: dst.String(),
			Reason: fmt.Sprintf("%s is the VM network's gateway, which serves only DNS (port 53); the host's loopback is %s", netip.AddrPortFrom(dst, uint16(port)), HostIP)}
	case subnet.Contains(dst):
		return netip.AddrPort{}, &netpolicy.Violation{Host: dst.String(), Port: port, Addr: dst.String(),
			Reason: fmt.Sprintf("%s is on the VM's own network %s, which has no other hosts", dst, Subnet)}
	}

	var refused *netpolicy.Violation
	for _, host := range n.candidates(dst, addr) {
		d := n.cfg.Policy.CheckName(host, port)
		if d.Allow {
			d = n.cfg.Policy.CheckAddr(host, addr, port)
		}
		if d.Allow {
			return netip.AddrPortFrom(addr, uint16(port)), nil
		}
		if refused == nil {
			refused = &netpolicy.Violation{Host: host, Port: port, Addr: addr.String(), Reason: d.Reason}
		}
	}
	return netip.AddrPort{}, refused
}

// candidates are the names the guest may have meant by dst (dialled at
// addr), as judge uses them.
func (n *Network) candidates(dst, addr netip.Addr) []string {
	candidates := append(n.names.lookup(dst), addr.String())
	if dst == hostAddr {
		// 127.0.0.1 is how the host is named in policies: judge (and
		// explain a refusal) by it first.
		candidates = append([]string{addr.String()}, candidates[:len(candidates)-1]...)
	}
	return candidates
}

// bound are the candidates for dst:port (dialled at addr) that a secret is
// bound to, and the interceptor that binds them; HostIP is HostName,
// whether the guest resolved it or not.
func (n *Network) bound(dst, addr netip.Addr, port int) ([]string, Interceptor) {
	ref := n.interceptor.Load()
	if ref == nil {
		return nil, nil
	}
	names := n.candidates(dst, addr)
	if dst == hostAddr {
		names = append(names, HostName)
	}
	var hosts []string
	for _, h := range names {
		if ref.Binds(h, port) && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts, ref.Interceptor
}

// nameCache remembers which names this network's DNS resolved to which
// addresses, each until its answer's TTL runs out, so that a connection to an
// address is judged by the names that currently stand for it.
type nameCache struct {
	now func() time.Time // time.Now; tests move it

	mu       sync.Mutex
	maxAddrs int
	maxNames int
	byAddr   map[netip.Addr]*list.Element // of *namedAddr
	lru      list.List                    // front: most recently used
}

type namedAddr struct {
	addr  netip.Addr
	names []namedUntil // most recent first
}

type namedUntil struct {
	name    string
	expires time.Time
}

func newNameCache(maxAddrs, maxNames int) *nameCache {
	return &nameCache{now: time.Now, maxAddrs: maxAddrs, maxNames: maxNames, byAddr: make(map[netip.Addr]*list.Element)}
}

// add records that name resolved to addr, for ttl from now.
func (c *nameCache) add(name string, addr netip.Addr, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	entry := namedUntil{name: name, expires: now.Add(ttl)}
	if el, ok := c.byAddr[addr]; ok {
		na := el.Value.(*namedAddr)
		names := make([]namedUntil, 0, c.maxNames)
		names = append(names, entry)
		for _, e := range na.names {
			if e.name != name && e.expires.After(now) && len(names) < c.maxNames {
				names = append(names, e)
			}
		}
		na.names = names
		c.lru.MoveToFront(el)
		return
	}
	if c.lru.Len() >= c.maxAddrs {
		oldest := c.lru.Back()
		c.lru.Remove(oldest)
		delete(c.byAddr, oldest.Value.(*namedAddr).addr)
	}
	c.byAddr[addr] = c.lru.PushFront(&namedAddr{addr: addr, names: []namedUntil{entry}})
}

// lookup returns the names that resolved to addr and have not expired, most
// recent first.
func (c *nameCache) lookup(addr netip.Addr) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byAddr[addr]
	if !ok {
		return nil
	}
	now := c.now()
	na := el.Value.(*namedAddr)
	var names []string
	live := na.names[:0]
	for _, e := range na.names {
		if e.expires.After(now) {
			names = append(names, e.name)
			live = append(live, e)
		}
	}
	na.names = live
	if len(live) == 0 {
		c.lru.Remove(el)
		delete(c.byAddr, addr)
		return nil
	}
	c.lru.MoveToFront(el)
	return names
}

// reportCache remembers which refusals were reported, so that a guest that
// repeats one does not flood OnViolation.
type reportCache struct {
	mu   sync.Mutex
	max  int
	seen map[string]time.Time
	fifo []string // insertion order, for eviction
}

func newReportCache(max int) *reportCache {
	return &reportCache{max: max, seen: make(map[string]time.Time)}
}

// first reports whether key should be reported now: it was not reported
// before, or (for window > 0) not within window.
func (c *reportCache) first(key string, window time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if last, ok := c.seen[key]; ok {
		if window <= 0 || now.Sub(last) < window {
			return false
		}
		c.seen[key] = now
		return true
	}
	if len(c.fifo) >= c.max {
		delete(c.seen, c.fifo[0])
		c.fifo = c.fifo[1:]
	}
	c.seen[key] = now
	c.fifo = append(c.fifo, key)
	return true
}
