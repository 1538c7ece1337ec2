package probe

import (
	"os"
	"testing"
)

// TestCheckKVMRuns runs the test guest where /dev/kvm is usable; the
// answer is logged, as it depends on the machine (a working KVM says ""; a
// device that cannot run guests says why).
func TestCheckKVMRuns(t *testing.T) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("no /dev/kvm here")
	}
	t.Logf("checkKVMRuns: %q", checkKVMRuns())
}
