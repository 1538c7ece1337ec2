package vmagent

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// TestNetlinkConfiguresLoopback runs the netlink calls in a fresh network
// namespace (on a thread of its own, which then exits) on its loopback link,
// the one link a new namespace has.
func TestNetlinkConfiguresLoopback(t *testing.T) {
	testutil.RequiresRoot(t)
	errc := make(chan string, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its namespace
		errc <- configureLoopbackInNewNetns()
	}()
	if msg := <-errc; msg != "" {
		if strings.HasPrefix(msg, "skip:") {
			t.Skip(msg)
		}
		t.Fatal(msg)
	}
}

func configureLoopbackInNewNetns() string {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return "skip: unshare a network namespace: " + err.Error()
	}
	if err := linkUp("lo"); err != nil {
		return err.Error()
	}
	if ifc, err := net.InterfaceByName("lo"); err != nil || ifc.Flags&net.FlagUp == 0 {
		return "lo is not up after linkUp"
	}
	prefix := netip.MustParsePrefix("10.231.0.2/24")
	if err := addAddress("lo", prefix); err != nil {
		return err.Error()
	}
	if err := addAddress("lo", prefix); err != nil {
		return "adding the same address twice: " + err.Error()
	}
	ifc, _ := net.InterfaceByName("lo")
	addrs, _ := ifc.Addrs()
	found := false
	for _, a := range addrs {
		found = found || a.String() == "10.231.0.2/24"
	}
	if !found {
		return "lo lacks 10.231.0.2/24 after addAddress: has " + strings.Join(addrStrings(addrs), " ")
	}
	if err := addDefaultRoute("lo", netip.MustParseAddr("10.231.0.1")); err != nil {
		return err.Error()
	}
	routes, err := os.ReadFile("/proc/thread-self/net/route")
	if err != nil {
		return err.Error()
	}
	// Destination 0.0.0.0, gateway 10.231.0.1 (little-endian hex 0100E70A).
	for _, line := range strings.Split(string(routes), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == "lo" && f[1] == "00000000" && f[2] == "0100E70A" {
			return ""
		}
	}
	return "no default route via 10.231.0.1 in:\n" + string(routes)
}

func addrStrings(addrs []net.Addr) []string {
	var s []string
	for _, a := range addrs {
		s = append(s, a.String())
	}
	return s
}

func TestNetlinkErrors(t *testing.T) {
	if err := linkUp("no-such-link0"); err == nil {
		t.Error("linkUp of a missing link succeeded")
	}
}

func TestBroadcast(t *testing.T) {
	for in, want := range map[string]string{
		"192.168.127.2/24": "192.168.127.255",
		"10.0.0.5/8":       "10.255.255.255",
		"10.0.0.5/30":      "10.0.0.7",
	} {
		b := broadcast(netip.MustParsePrefix(in))
		if got := netip.AddrFrom4(b).String(); got != want {
			t.Errorf("broadcast(%s) = %s, want %s", in, got, want)
		}
	}
}
