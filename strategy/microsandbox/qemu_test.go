package microsandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/testutil"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage"
)

// testImage returns QEMU and the guest image make image puts in bin/image,
// or skips.
func testImage(t *testing.T) (string, *vmimage.Image) {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	img, err := vmimage.Default(filepath.Join("..", "..", "bin", "image"))
	if err != nil {
		t.Skipf("no guest image (make image builds it): %v", err)
	}
	return qemu, img
}

// brokenKernel is the image's kernel cut short: QEMU refuses it.
func brokenKernel(t *testing.T, img *vmimage.Image) string {
	t.Helper()
	data, err := os.ReadFile(img.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(path, data[:1024], 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckQEMUStarts starts QEMU paused the way sessions do, under TCG
// (which runs anywhere QEMU does): the image's kernel passes, a broken one
// fails with QEMU's words.
func TestCheckQEMUStarts(t *testing.T) {
	qemu, img := testImage(t)
	vm := microvm.Config{VM: session.VM{CPUs: 1, MemoryMiB: 256, Accelerator: "tcg", Kernel: img.Kernel, Initrd: img.Initrd}}
	if r := checkQEMUStarts(qemu, vm); r != "" {
		t.Errorf("checkQEMUStarts with the image's kernel: %s", r)
	}
	vm.Kernel = brokenKernel(t, img)
	r := checkQEMUStarts(qemu, vm)
	if !strings.Contains(r, "QEMU cannot start a VM") || !strings.Contains(r, "invalid kernel header") {
		t.Errorf("checkQEMUStarts with a broken kernel: %q; want QEMU's own error", r)
	}
	testutil.Documented(t, operationsGuide, r)
}

// TestCheckKernelBoots boots the image's kernel to the end of its start
// under TCG, which boots it here; a broken kernel does not boot, with
// QEMU's words. (Under KVM the check runs the same way: see the
// integration test TestProbeKVMMeansSessionsBoot.)
func TestCheckKernelBoots(t *testing.T) {
	qemu, img := testImage(t)
	vm := microvm.Config{VM: session.VM{CPUs: 1, MemoryMiB: 256, Accelerator: "tcg", Kernel: img.Kernel}}
	if r := checkKernelBoots(qemu, vm); r != "" {
		t.Errorf("checkKernelBoots under TCG: %s", r)
	}
	vm.Kernel = brokenKernel(t, img)
	r := checkKernelBoots(qemu, vm)
	if !strings.Contains(r, "stopped before the guest kernel booted") || !strings.Contains(r, "invalid kernel header") {
		t.Errorf("checkKernelBoots with a broken kernel: %q; want QEMU's own error", r)
	}
	testutil.Documented(t, operationsGuide, r)
}

// TestKernelStubLoads: QEMU builds a session's machine with a restore's
// stand-in kernel (the image kernel's boot header) as it does with the
// kernel itself.
func TestKernelStubLoads(t *testing.T) {
	qemu, img := testImage(t)
	vm := microvm.Config{VM: session.VM{CPUs: 1, MemoryMiB: 256, Accelerator: "tcg", Transport: "serial", Kernel: img.Kernel, Initrd: img.Initrd}}
	stub, err := kernelStub(vm)
	if err != nil || stub == nil {
		t.Fatalf("the image's kernel: stub %v, %v; want one", stub, err)
	}
	defer stub.Close()
	fi, err := stub.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if kernel, _ := os.Stat(img.Kernel); fi.Size() >= kernel.Size()/100 {
		t.Errorf("the stub holds %d bytes of a %d-byte kernel: more than its header", fi.Size(), kernel.Size())
	}
	vm.Kernel = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), stub.Fd())
	if r := checkQEMUStarts(qemu, vm); r != "" {
		t.Errorf("QEMU with the stub as its kernel: %s", r)
	}
}
