// Package microvm runs a session's VM on the host: its disks, its virtiofs
// shares, and the QEMU command line, confined so that QEMU sees the session's
// files and nothing else of the daemon's home.
package microvm

import (
	"fmt"
	"strconv"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// Config is one VM: what the supervisor chose (session.VM), with the
// command lines and paths that QEMU and virtiofsd are started with.
type Config struct {
	session.VM
}

// Disk names: each is a file in Dir and the serial the guest finds it by.
const (
	DiskUpper  = "upper"  // the root overlay's writable layer
	DiskDocker = "docker" // /var/lib/docker
	DiskRoot   = "root"   // the image, read-only
)

// Sockets in RunDir.
func (c Config) agentSocket() string      { return c.RunDir + "/agent.sock" }
func (c Config) netSocket() string        { return c.RunDir + "/net.sock" }
func (c Config) shareSocket(i int) string { return c.RunDir + "/fs" + strconv.Itoa(i) + ".sock" }
func (c Config) qmpSocket() string        { return c.RunDir + "/qmp.sock" }

// MachineArgs is the part of QEMU's command line that decides whether a
// guest can run here at all: the machine type, the accelerator and CPU
// model, the vCPUs, the memory (shared, for virtiofs) and QEMU's own
// sandbox. QEMUArgs starts with it, and the probe starts QEMU with it, so
// that what the probe tries is what a session runs.
func (c Config) MachineArgs(l Launch) []string {
	mem := strconv.Itoa(c.MemoryMiB)
	// virtiofs needs the guest's memory shared with virtiofsd.
	backend := "memory-backend-memfd,id=mem,size=" + mem + "M,share=on"
	if l.RAMFD > 0 {
		backend = "memory-backend-file,id=mem,size=" + mem + "M,share=on,mem-path=/proc/self/fd/" + strconv.Itoa(l.RAMFD)
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-M", "q35", "-smp", strconv.Itoa(c.CPUs), "-m", mem,
		"-object", backend, "-machine", "memory-backend=mem",
		// QEMU's own seccomp sandbox: no new privileges, no spawning.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
	}
	if c.Accelerator == "kvm" {
		return append(args, "-accel", "kvm", "-cpu", "host")
	}
	// TCG's default model (qemu64) lacks SSE3 and AVX, which prebuilt
	// runtimes need (opencode's binary dies of SIGILL on it): "max" is
	// every feature TCG emulates.
	accel := "tcg"
	if c.TCGCacheMiB > 0 {
		accel += ",tb-size=" + strconv.Itoa(c.TCGCacheMiB)
	}
	return append(args, "-accel", accel, "-cpu", "max")
}

// Launch is what differs between two starts of the same VM.
type Launch struct {
	// RAMFD is QEMU's descriptor of the guest's RAM, a memfd the shim made
	// (0: QEMU makes its own). A VM with snapshots has one: the shim copies
	// a snapshot's RAM into it, or saves it as one.
	RAMFD int
	// Incoming: QEMU waits for the device state of a snapshot on its
	// monitor (migrate-incoming) instead of booting.
	Incoming bool
	// KernelFD is QEMU's descriptor of the kernel it loads instead of
	// Config.Kernel (0: that one): a restore's KernelStub.
	KernelFD int
}

// QEMUArgs is the QEMU command line for c, after the binary's name.
func (c Config) QEMUArgs(l Launch) []string {
	// cryptomgr.notests: the kernel's boot-time self-tests of its crypto
	// algorithms (test vectors, not a boundary) took ~0.6 s of a 2.4 s TCG
	// boot to /init.
	cmdline := "console=ttyS0 quiet panic=-1 cryptomgr.notests agentconnect.transport=" + c.Transport
	kernel := c.Kernel
	if l.KernelFD > 0 {
		kernel = "/proc/self/fd/" + strconv.Itoa(l.KernelFD)
	}
	args := append(c.MachineArgs(l),
		"-kernel", kernel, "-initrd", c.Initrd,
		// The serial console goes to QEMU's stdout, which the shim copies
		// to console.log, bounded: the guest writes to it at will.
		"-serial", "file:/dev/stdout",
	)
	// Entropy from the host, so that nothing in the guest blocks for it.
	args = append(args, "-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0")
	// The guest reports the pages it frees, and QEMU gives them back to the
	// host: an idle VM costs what it uses, not what it once touched.
	args = append(args, "-device", "virtio-balloon-pci,free-page-reporting=on")
	for _, d := range []struct {
		name, file string
		readonly   bool
	}{{DiskRoot, c.Rootfs, true}, {DiskUpper, c.Dir + "/" + DiskUpper + ".img", false}, {DiskDocker, c.Dir + "/" + DiskDocker + ".img", false}} {
		drive := "file=" + d.file + ",format=raw,if=none,id=" + d.name + ",cache=unsafe"
		if d.readonly {
			drive = "file=" + d.file + ",format=raw,if=none,id=" + d.name + ",readonly=on"
		}
		args = append(args, "-drive", drive, "-device", "virtio-blk-pci,drive="+d.name+",serial="+d.name)
	}
	for i, s := range c.Shares {
		if c.Snapshots() {
			// A slot for it: the share is plugged in once QEMU runs
			// (ShareHotplug), as QEMU 7.2 cannot migrate vhost-user-fs.
			args = append(args, "-device", "pcie-root-port,id="+sharePort(i)+",bus=pcie.0,chassis="+strconv.Itoa(i+1))
			continue
		}
		id := "fs" + strconv.Itoa(i)
		args = append(args, "-chardev", "socket,id="+id+",path="+c.shareSocket(i),
			"-device", "vhost-user-fs-pci,chardev="+id+",tag="+s.Tag)
	}
	if c.Transport == "vsock" {
		args = append(args, "-device", fmt.Sprintf("vhost-vsock-pci,guest-cid=%d", c.CID))
	} else {
		args = append(args, "-device", "virtio-serial-pci",
			"-chardev", "socket,id=agent,path="+c.agentSocket()+",server=on,wait=off",
			"-device", "virtserialport,chardev=agent,name=agentconnect,id="+AgentPortID)
	}
	if c.Snapshots() {
		args = append(args, "-qmp", "unix:"+c.qmpSocket()+",server=on,wait=off")
	}
	if l.Incoming {
		args = append(args, "-incoming", "defer")
	}
	// The NIC: QEMU connects to the shim's user-mode network stack, which
	// judges every connection; never QEMU's own -netdev user.
	args = append(args, "-netdev", "stream,id=n0,server=off,addr.type=unix,addr.path="+c.netSocket(),
		"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56")
	return append(args, "-append", cmdline)
}
