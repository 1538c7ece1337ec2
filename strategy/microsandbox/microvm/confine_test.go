package microvm

import (
	"syscall"
	"testing"
)

func TestShareIDMap(t *testing.T) {
	// mapped is where id inside lands outside, or -1.
	mapped := func(m []syscall.SysProcIDMap, inside int) int {
		for _, e := range m {
			if inside >= e.ContainerID && inside < e.ContainerID+e.Size {
				return e.HostID + inside - e.ContainerID
			}
		}
		return -1
	}
	for _, c := range []struct{ guest, owner uint32 }{{10001, 1000}, {10001, 0}, {10001, 10001}, {10001, 10002}, {10001, 4294967294}} {
		m := ShareIDMap(c.guest, c.owner)
		if len(m) > 5 {
			t.Errorf("%v: %d lines; the kernel takes 340, old ones 5", c, len(m))
		}
		if got := mapped(m, int(c.guest)); got != int(c.owner) {
			t.Errorf("%v: the runtime id is %d outside, want the owner %d", c, got, c.owner)
		}
		if got := mapped(m, int(c.owner)); got != int(c.guest) {
			t.Errorf("%v: the owner's id inside is %d outside, want %d", c, got, c.guest)
		}
		total := 0
		for i, e := range m {
			total += e.Size
			for _, o := range m[i+1:] {
				if e.HostID < o.HostID+o.Size && o.HostID < e.HostID+e.Size {
					t.Errorf("%v: host ranges %v and %v overlap", c, e, o)
				}
			}
		}
		if total != idMax {
			t.Errorf("%v: %d ids mapped, want every one (%d)", c, total, idMax)
		}
		for _, id := range []int{0, 1, 999, 1001, 65534, 4294967294} {
			if id != int(c.guest) && id != int(c.owner) && mapped(m, id) != id {
				t.Errorf("%v: id %d is %d outside, want itself", c, id, mapped(m, id))
			}
		}
	}
}
