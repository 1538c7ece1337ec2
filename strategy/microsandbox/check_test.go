package microsandbox

import (
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/config"
)

// Without KVM and vsock (as on CI), tcg over serial gets as far as the
// image: the reason names the directory it is missing from.
func TestCheckWithoutAnImage(t *testing.T) {
	vm := config.Default().VM
	vm.Accelerator, vm.Transport = "tcg", "serial"
	dir := t.TempDir()
	if r := Check(vm, dir); !strings.Contains(r, dir) && !strings.Contains(r, "qemu") && !strings.Contains(r, "virtiofsd") {
		t.Errorf("microsandbox with tcg and no image: reason %q names neither the image directory nor a missing tool", r)
	}
}
