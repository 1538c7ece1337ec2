// Package microsandbox is the microsandbox strategy's host side beyond one
// run: the check that says whether VMs can run here, and the preparation of
// guest images, both run by the VM shim for the daemon (which links none of
// the VM code).
package microsandbox

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage"
)

// Check says why microsandbox sessions cannot run here with the settings vm
// and the default image in imageDir, or "": the machine can run a VM per
// session with the configured accelerator and transport, the host tools are
// there and can run as this user, the image is in place, and QEMU starts a
// VM the way a session does (with KVM: boots the guest kernel). It downloads
// nothing; a custom image reference is only checked to be well-formed. The
// cheap checks go first, QEMU last.
func Check(vm config.VM, imageDir string) string {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		return fmt.Sprintf("microsandbox needs a Linux amd64 host; this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	if vm.Accelerator == "kvm" {
		if r := checkDevice("/dev/kvm", "KVM", kvmFix); r != "" {
			return r
		}
		if r := checkKVMRuns(); r != "" {
			return r + ": set sandbox.microsandbox.accelerator to \"tcg\" (software emulation, much slower)"
		}
	}
	if vm.Transport == "vsock" {
		if r := checkDevice("/dev/vhost-vsock", "vsock", vsockFix); r != "" {
			return r
		}
	}
	tools, err := microvm.FindTools()
	if err != nil {
		return err.Error()
	}
	out, err := exec.Command(tools.QEMU, "-version").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("%s cannot run here: %v: %s", tools.QEMU, err, strings.TrimSpace(string(out)))
	}
	if os.Geteuid() != 0 && isQEMUVirtiofsd(tools.Virtiofsd) {
		return fmt.Sprintf("%s (QEMU 7.2's virtiofsd) cannot run as a non-root user: it fails with \"setgroups() failed\"; "+
			"run the daemon as root, or install the Rust virtiofsd (the virtiofsd package of newer releases)", tools.Virtiofsd)
	}
	if vm.Image != "" {
		if err := vmimage.CheckRef(vm.Image); err != nil {
			return fmt.Sprintf("sandbox.microsandbox.image: %v", err)
		}
	}
	// The kernel and initramfs always come from the default image.
	img, err := vmimage.Default(imageDir)
	if err != nil {
		return err.Error()
	}
	check := microvm.Config{VM: session.VM{CPUs: vm.CPUs, MemoryMiB: vm.MemoryMiB, Accelerator: vm.Accelerator, Kernel: img.Kernel, Initrd: img.Initrd}}
	if r := checkQEMUStarts(tools.QEMU, check); r != "" {
		return r
	}
	if vm.Accelerator == "kvm" {
		return checkKernelBoots(tools.QEMU, check)
	}
	return ""
}

// The fixes for a device the daemon user cannot use.
const (
	kvmFix = "add the daemon user to the kvm group (usermod -aG kvm USER) and, on a virtual machine, turn on nested virtualization; " +
		"or set sandbox.microsandbox.accelerator to \"tcg\" (software emulation, much slower)"
	vsockFix = "load the vhost_vsock module (modprobe vhost_vsock) and give the daemon user access to /dev/vhost-vsock; " +
		"or set sandbox.microsandbox.transport to \"serial\""
)

// checkDevice says why this user cannot use a device, or "".
func checkDevice(path, what, fix string) string {
	if _, err := os.Stat(path); err != nil {
		return fmt.Sprintf("%s is missing, so %s is not available here: %s", path, what, fix)
	}
	if err := unix.Access(path, unix.R_OK|unix.W_OK); err != nil {
		return fmt.Sprintf("the daemon user cannot open %s (%v): %s", path, err, fix)
	}
	return ""
}

// isQEMUVirtiofsd tells QEMU's C virtiofsd (which needs root) from the Rust
// one, by its version output.
func isQEMUVirtiofsd(path string) bool {
	cmd := exec.Command(path, "--version")
	done := make(chan []byte, 1)
	go func() {
		out, _ := cmd.CombinedOutput()
		done <- out
	}()
	select {
	case out := <-done:
		return strings.Contains(string(out), "QEMU")
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		return true
	}
}
