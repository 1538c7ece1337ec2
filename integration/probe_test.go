package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProbeKVMMeansSessionsBoot: with the KVM accelerator configured on a
// host whose /dev/kvm opens, `agentconnect probe` reports microsandbox
// available only if a session really boots, and otherwise unavailable with
// QEMU's reason and what to do. This machine is the second kind: its
// nested KVM runs a one-instruction guest but boots a Linux guest far too
// slowly, and every session used to time out while the probe said
// available.
func TestProbeKVMMeansSessionsBoot(t *testing.T) {
	requireMicrosandbox(t)
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("no /dev/kvm here: the KVM probe is checked where there is one")
	}
	h := newHome(t)
	cfg := `{"sandbox": {"microsandbox": {"accelerator": "kvm", "transport": "serial", "cpus": 1, "memoryMiB": 512}}}`
	if err := os.WriteFile(filepath.Join(h, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var probes []struct {
		Name      string
		Available bool
		Reason    string
	}
	start := time.Now()
	okJSON(t, h, &probes, "probe")
	t.Logf("probe took %v", time.Since(start).Round(time.Millisecond))
	var ms *struct {
		Name      string
		Available bool
		Reason    string
	}
	for i := range probes {
		if probes[i].Name == "microsandbox" {
			ms = &probes[i]
		}
	}
	if ms == nil {
		t.Fatalf("probe lists no microsandbox: %+v", probes)
	}
	if !ms.Available {
		t.Logf("microsandbox with KVM: %s", ms.Reason)
		if !strings.Contains(ms.Reason, "QEMU") || !strings.Contains(ms.Reason, `accelerator to "tcg"`) {
			t.Errorf("reason %q: want QEMU's failure and the fix (accelerator tcg)", ms.Reason)
		}
		return
	}
	// Available: then a session boots, or the probe lied.
	startDaemon(t, h)
	ok(t, h, "agent", "create", "kvm", "--strategy", "microsandbox", "--", "true")
	if r := run(t, h, "", "exec", "kvm"); r.code != 0 {
		t.Fatalf("the probe says microsandbox with KVM is available, but a session: exit %d, stderr %q", r.code, r.stderr)
	}
}
