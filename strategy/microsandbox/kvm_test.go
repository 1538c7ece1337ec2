package microsandbox

import (
	"os"
	"testing"
)

// TestCheckKVMRuns runs the test guest where /dev/kvm opens: a wrong ioctl
// number, structure layout or register setup fails it (EINVAL, or an exit
// other than hlt).
func TestCheckKVMRuns(t *testing.T) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no usable /dev/kvm here: %v", err)
	}
	f.Close()
	if r := checkKVMRuns(); r != "" {
		t.Errorf("checkKVMRuns: %s", r)
	}
}
