package microsandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/testutil"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
)

const operationsGuide = "../../docs/operations.md"

// TestReasonsAreDocumented produces the microsandbox check's reasons that
// need no broken device or QEMU (TestCheckQEMUStarts and
// TestCheckKernelBoots check QEMU's) and requires the operator guide to
// have each.
func TestReasonsAreDocumented(t *testing.T) {
	path := os.Getenv("PATH")
	missing := filepath.Join(t.TempDir(), "missing")
	var msgs []string
	// A device that is not there, reported by its real path.
	for _, d := range []struct{ path, what, fix string }{{"/dev/kvm", "KVM", kvmFix}, {"/dev/vhost-vsock", "vsock", vsockFix}} {
		msgs = append(msgs, strings.ReplaceAll(checkDevice(missing, d.what, d.fix), missing, d.path))
	}
	// The tools: no QEMU in PATH, then QEMU without bwrap.
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	onlyQEMU := t.TempDir()
	if err := os.Symlink(qemu, filepath.Join(onlyQEMU, "qemu-system-x86_64")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	_, err = microvm.FindTools()
	msgs = append(msgs, err.Error())
	t.Setenv("PATH", onlyQEMU)
	if _, err = microvm.FindTools(); err != nil { // virtiofsd is found by its paths first
		msgs = append(msgs, err.Error())
	}
	t.Setenv("PATH", path)
	// No image; a malformed custom image reference.
	vm := config.Default().VM
	vm.Accelerator, vm.Transport = "tcg", "serial"
	msgs = append(msgs, Check(vm, t.TempDir()))
	vm.Image = "oci:"
	msgs = append(msgs, Check(vm, t.TempDir()))
	for _, m := range msgs {
		if m == "" {
			t.Fatalf("a check gave no reason where the test expects one: %q", msgs)
		}
	}
	testutil.Documented(t, operationsGuide, msgs...)
}
