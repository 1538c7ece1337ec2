package microvm

import (
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// TestQEMUArgsDensity: every VM gets the balloon that reports free pages,
// and a tcg VM the translation cache it is configured with (QEMU's own
// default otherwise); kvm has no translation cache.
func TestQEMUArgsDensity(t *testing.T) {
	line := func(vm session.VM) string { return strings.Join(Config{VM: vm}.QEMUArgs(), " ") }
	base := session.VM{CPUs: 1, MemoryMiB: 512, Accelerator: "tcg", Transport: "serial"}
	if got := line(base); !strings.Contains(got, "-device virtio-balloon-pci,free-page-reporting=on") || !strings.Contains(got, "-accel tcg -cpu max") {
		t.Errorf("a tcg VM's QEMU line lacks the balloon or has a tb-size of its own: %s", got)
	}
	sized := base
	sized.TCGCacheMiB = 64
	if got := line(sized); !strings.Contains(got, "-accel tcg,tb-size=64 ") {
		t.Errorf("tcgCacheMiB 64 did not reach QEMU: %s", got)
	}
	kvm := sized
	kvm.Accelerator = "kvm"
	if got := line(kvm); strings.Contains(got, "tb-size") || !strings.Contains(got, "-accel kvm") {
		t.Errorf("a kvm VM got a translation cache: %s", got)
	}
}
