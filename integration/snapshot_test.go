package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMicrosandboxSnapshot: the first VM start boots and saves a snapshot;
// the next ones restore it, and each is its own machine: random numbers no
// other clone has, the host's time, its shares plugged in after the restore
// (a file written through the workspace reaches the host), a machine id of
// its own. A snapshot that
// does not restore is removed, and the session boots instead.
func TestMicrosandboxSnapshot(t *testing.T) {
	requireMicrosandbox(t)
	h, _ := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "snap", "--strategy", "microsandbox", "--", "/bin/sh", "-c", `
r=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "random $r"
echo "time $(date +%s)"
echo "machine $(cat /etc/machine-id)"
echo "$r" > "from-guest-$r"
echo "files $(ls | grep -c from-guest-)"
`)
	ws := filepath.Join(agentDir(t, h, "snap"), "workspace")
	snapDir := filepath.Join(h, "vm-snapshots")
	randoms, machines := map[string]string{}, map[string]string{}
	turn := func(what string) (string, string) {
		t.Helper()
		id, out := startAndWait(t, h, "snap", "")
		got := parseCodes(out)
		r := got["random"]
		if len(r) != 32 {
			t.Fatalf("%s: no random bytes from the guest:\n%s", what, out)
		}
		if other, seen := randoms[r]; seen {
			t.Errorf("%s: the guest's random bytes %s are %s's too: the restore did not reseed its pool", what, r, other)
		}
		randoms[r] = what
		if m := got["machine"]; len(m) != 32 {
			t.Errorf("%s: machine id %q, want 32 hex digits", what, m)
		} else if other, seen := machines[m]; seen {
			t.Errorf("%s: machine id %s is %s's too", what, m, other)
		} else {
			machines[m] = what
		}
		if guest, err := strconv.ParseInt(got["time"], 10, 64); err != nil || abs(guest-time.Now().Unix()) > 30 {
			t.Errorf("%s: the guest's clock says %q, the host's %d", what, got["time"], time.Now().Unix())
		}
		if b, err := os.ReadFile(filepath.Join(ws, "from-guest-"+r)); err != nil || strings.TrimSpace(string(b)) != r {
			t.Errorf("%s: the file the guest wrote through its workspace, on the host: %q, %v", what, b, err)
		}
		return id, shimLog(h, id)
	}

	_, log := turn("the first start")
	if !strings.Contains(log, "saved the VM's snapshot") {
		t.Fatalf("the first start saved no snapshot; shim log:\n%s", log)
	}
	snaps, _ := os.ReadDir(snapDir)
	if len(snaps) != 1 {
		t.Fatalf("%s holds %d entries after the first start, want 1", snapDir, len(snaps))
	}
	for _, what := range []string{"the second start", "the third start"} {
		if _, log := turn(what); !strings.Contains(log, "restore ") || strings.Contains(log, "saved the VM's snapshot") {
			t.Errorf("%s did not restore the snapshot; shim log:\n%s", what, log)
		}
	}

	// A snapshot whose device state is cut short.
	state := filepath.Join(snapDir, snaps[0].Name(), "state")
	if err := os.Truncate(state, 100); err != nil {
		t.Fatal(err)
	}
	_, log = turn("a start from a broken snapshot")
	if !strings.Contains(log, "did not restore") || !strings.Contains(log, "saved the VM's snapshot") {
		t.Errorf("a broken snapshot: want a warning, a boot and a new snapshot; shim log:\n%s", log)
	}
	if fi, err := os.Stat(state); err != nil || fi.Size() <= 100 {
		t.Errorf("the broken snapshot was not replaced: %v, %v", fi, err)
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
