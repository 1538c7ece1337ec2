package microsandbox

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KVM ioctls and exit reasons (linux/kvm.h).
const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46
	kvmRun                 = 0xAE80
	kvmGetSregs            = 0x8138AE83
	kvmSetSregs            = 0x4138AE84
	kvmSetRegs             = 0x4090AE82

	kvmExitHLT = 5
	kvmAPI     = 12
)

// Offsets in struct kvm_sregs of the code segment's base and selector
// (its first field), and of rip and rflags in struct kvm_regs.
const (
	sregsSize   = 312
	regsSize    = 144
	regsRIP     = 16 * 8
	regsRFLAGS  = 17 * 8
	segBase     = 0
	segSelector = 12
)

// checkKVMRuns runs a one-instruction guest (hlt, in real mode) on
// /dev/kvm: a device node that opens is not enough, as some hosts and
// sandboxes expose one that cannot run a guest. It returns why not, or "".
func checkKVMRuns() string {
	kvm, err := os.OpenFile("/dev/kvm", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Sprintf("cannot open /dev/kvm: %v", err)
	}
	defer kvm.Close()
	if v, err := ioctl(kvm.Fd(), kvmGetAPIVersion, 0); err != nil || v != kvmAPI {
		return fmt.Sprintf("/dev/kvm answers KVM API version %d (%v), want %d", v, err, kvmAPI)
	}
	vmfd, err := ioctl(kvm.Fd(), kvmCreateVM, 0)
	if err != nil {
		return fmt.Sprintf("/dev/kvm cannot create a VM: %v", err)
	}
	defer unix.Close(int(vmfd))

	// One page of guest memory at address 0 holding hlt.
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Sprintf("KVM check: %v", err)
	}
	defer unix.Munmap(mem)
	mem[0] = 0xf4 // hlt
	region := struct {
		slot, flags                  uint32
		guestPhys, size, userAddress uint64
	}{size: 4096, userAddress: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	if err := ioctlPtr(vmfd, kvmSetUserMemoryRegion, unsafe.Pointer(&region)); err != nil {
		return fmt.Sprintf("/dev/kvm cannot map guest memory: %v", err)
	}
	vcpu, err := ioctl(vmfd, kvmCreateVCPU, 0)
	if err != nil {
		return fmt.Sprintf("/dev/kvm cannot create a virtual CPU: %v", err)
	}
	defer unix.Close(int(vcpu))
	size, err := ioctl(kvm.Fd(), kvmGetVCPUMmapSize, 0)
	if err != nil {
		return fmt.Sprintf("KVM check: %v", err)
	}
	run, err := unix.Mmap(int(vcpu), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Sprintf("KVM check: %v", err)
	}
	defer unix.Munmap(run)

	var sregs [sregsSize]byte
	if err := ioctlPtr(vcpu, kvmGetSregs, unsafe.Pointer(&sregs[0])); err != nil {
		return fmt.Sprintf("KVM check: %v", err)
	}
	*(*uint64)(unsafe.Pointer(&sregs[segBase])) = 0
	*(*uint16)(unsafe.Pointer(&sregs[segSelector])) = 0
	if err := ioctlPtr(vcpu, kvmSetSregs, unsafe.Pointer(&sregs[0])); err != nil {
		return fmt.Sprintf("KVM check: %v", err)
	}
	var regs [regsSize]byte
	*(*uint64)(unsafe.Pointer(&regs[regsRIP])) = 0
	*(*uint64)(unsafe.Pointer(&regs[regsRFLAGS])) = 2
	if err := ioctlPtr(vcpu, kvmSetRegs, unsafe.Pointer(&regs[0])); err != nil {
		return fmt.Sprintf("KVM check: %v", err)
	}
	if _, err := ioctl(vcpu, kvmRun, 0); err != nil {
		return fmt.Sprintf("/dev/kvm cannot run a guest: %v", err)
	}
	// struct kvm_run starts with request_interrupt_window and
	// immediate_exit (one byte each), padding to 8, then exit_reason.
	if reason := *(*uint32)(unsafe.Pointer(&run[8])); reason != kvmExitHLT {
		return fmt.Sprintf("/dev/kvm opens but cannot run a guest here (a one-instruction test guest stopped with KVM exit reason %d, not hlt)", reason)
	}
	return ""
}

func ioctl(fd, req, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// ioctlPtr passes a pointer argument; as an unsafe.Pointer up to the
// system call, it keeps what it points to alive and in place.
func ioctlPtr(fd, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}
