package microvm

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// TestQEMUArgsDensity: every VM gets the balloon that reports free pages,
// and a tcg VM the translation cache it is configured with (QEMU's own
// default otherwise); kvm has no translation cache.
func TestQEMUArgsDensity(t *testing.T) {
	line := func(vm session.VM) string { return strings.Join(Config{VM: vm}.QEMUArgs(Launch{}), " ") }
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

// TestSnapshotKey: a key changes with what the guest saw at boot and stays
// the same across what is each VM's own (its paths, its shares' sources and
// tags); a VM on vsock has no snapshots.
func TestSnapshotKey(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{}
	for _, name := range []string{"qemu", "vmlinuz", "initrd.img"} {
		files[name] = filepath.Join(dir, name)
		os.WriteFile(files[name], []byte(name), 0o644)
	}
	base := Config{VM: session.VM{Kernel: files["vmlinuz"], Initrd: files["initrd.img"], Rootfs: "/img/rootfs.img",
		ImageDigest: "sha256:aa", CPUs: 1, MemoryMiB: 512, DiskGiB: 10, Accelerator: "tcg", Transport: "serial",
		Dir: "/home/vms/a", RunDir: "/run/a.vm", Shares: []session.VMShare{{Source: "/ws/a", Target: "/ws/a", Tag: "ws"}}}}
	key := func(c Config) string {
		t.Helper()
		k, err := c.SnapshotKey(files["qemu"])
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k := key(base)
	same := base
	same.Dir, same.RunDir = "/home/vms/b", "/run/b.vm"
	same.Shares = []session.VMShare{{Source: "/ws/b", Target: "/ws/b", Tag: "other"}}
	if key(same) != k {
		t.Error("another VM's own paths and share changed the key")
	}
	for name, change := range map[string]func(*Config){
		"memory":      func(c *Config) { c.MemoryMiB = 640 },
		"CPUs":        func(c *Config) { c.CPUs = 2 },
		"disk size":   func(c *Config) { c.DiskGiB = 20 },
		"image":       func(c *Config) { c.ImageDigest = "sha256:bb" },
		"share count": func(c *Config) { c.Shares = append(c.Shares, session.VMShare{Source: "/x", Target: "/x", Tag: "x"}) },
		"tcg cache":   func(c *Config) { c.TCGCacheMiB = 64 },
		"accelerator": func(c *Config) { c.Accelerator = "kvm" },
		"kernel file": func(c *Config) { os.WriteFile(files["vmlinuz"], []byte("a new kernel"), 0o644) },
		"initrd file": func(c *Config) { os.WriteFile(files["initrd.img"], []byte("a new guest agent"), 0o644) },
		"QEMU's file": func(c *Config) { os.WriteFile(files["qemu"], []byte("a new QEMU"), 0o644) },
	} {
		c := base
		c.Shares = append([]session.VMShare(nil), base.Shares...)
		change(&c)
		if key(c) == k {
			t.Errorf("a new %s kept the key", name)
		}
		k = key(base) // the files may have changed under base too
	}
	if c := base; func() bool { c.Transport = "vsock"; return c.Snapshots() }() {
		t.Error("a vsock VM has snapshots")
	}
	if _, err := base.SnapshotKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("a key for a QEMU that is not there")
	}
}

// TestSnapshotLayout: a serial VM's RAM is the shim's memfd, its shares
// are root ports to plug them into (QEMU 7.2 cannot migrate vhost-user-fs),
// it has a QMP monitor, and a restore waits for the snapshot; a vsock VM
// keeps its shares on the command line.
func TestSnapshotLayout(t *testing.T) {
	vm := session.VM{CPUs: 1, MemoryMiB: 512, Accelerator: "tcg", Transport: "serial", RunDir: "/r",
		Shares: []session.VMShare{{Tag: "ws"}, {Tag: "home"}}}
	c := Config{VM: vm}
	line := strings.Join(c.QEMUArgs(Launch{RAMFD: 5, Incoming: true}), " ")
	for _, want := range []string{
		"memory-backend-file,id=mem,size=512M,share=on,mem-path=/proc/self/fd/5",
		"-device pcie-root-port,id=rp0,bus=pcie.0,chassis=1 -device pcie-root-port,id=rp1,bus=pcie.0,chassis=2",
		"-qmp unix:/r/qmp.sock,server=on,wait=off", "-incoming defer", "name=agentconnect,id=" + AgentPortID,
	} {
		if !strings.Contains(line, want) {
			t.Errorf("the serial VM's QEMU line lacks %q: %s", want, line)
		}
	}
	if strings.Contains(line, "vhost-user-fs") {
		t.Errorf("a share on the serial VM's command line: %s", line)
	}
	chardev, device := c.ShareHotplug(1)
	if chardev["id"] != "fs1" || device["chardev"] != "fs1" || device["bus"] != "rp1" || device["tag"] != "home" {
		t.Errorf("share 1 plugs in as %v, %v", chardev, device)
	}
	vm.Transport = "vsock"
	line = strings.Join(Config{VM: vm}.QEMUArgs(Launch{}), " ")
	if !strings.Contains(line, "vhost-user-fs-pci,chardev=fs1,tag=home") || strings.Contains(line, "-qmp") ||
		!strings.Contains(line, "memory-backend-memfd") {
		t.Errorf("the vsock VM's QEMU line: %s", line)
	}
}

// TestKernelStub: a restore's stand-in kernel is the kernel's boot header
// (its real-mode sectors, setup_sects 0 meaning 4) and a page of zeros;
// a file that is no bzImage has none, and QEMU loads the stub by its
// descriptor.
func TestKernelStub(t *testing.T) {
	dir := t.TempDir()
	bzImage := func(sects byte) string {
		data := make([]byte, 20000)
		for i := range data {
			data[i] = byte(i%251) + 1
		}
		data[0x1f1] = sects
		copy(data[0x202:], "HdrS")
		path := filepath.Join(dir, "vmlinuz"+strconv.Itoa(int(sects)))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for sects, header := range map[byte]int{3: 2048, 0: 2560} {
		kernel := bzImage(sects)
		stub, err := Config{VM: session.VM{Kernel: kernel}}.KernelStub()
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(kernel)
		if len(stub) != header+4096 || !bytes.Equal(stub[:header], data[:header]) || bytes.Count(stub[header:], []byte{0}) != len(stub)-header {
			t.Errorf("setup_sects %d: a stub of %d bytes, want the first %d of the kernel and 4096 zeros", sects, len(stub), header)
		}
	}
	elf := filepath.Join(dir, "vmlinux")
	os.WriteFile(elf, append([]byte("\x7fELF"), make([]byte, 4096)...), 0o644)
	if stub, err := (Config{VM: session.VM{Kernel: elf}}).KernelStub(); err != nil || stub != nil {
		t.Errorf("a kernel that is no bzImage: stub of %d bytes, %v; want none", len(stub), err)
	}
	if _, err := (Config{VM: session.VM{Kernel: filepath.Join(dir, "absent")}}).KernelStub(); err == nil {
		t.Error("a kernel that does not exist: no error")
	}

	c := Config{VM: session.VM{Kernel: "/img/vmlinuz", CPUs: 1, MemoryMiB: 512, Accelerator: "tcg", Transport: "serial"}}
	if got := strings.Join(c.QEMUArgs(Launch{RAMFD: 5, Incoming: true, KernelFD: 6}), " "); !strings.Contains(got, "-kernel /proc/self/fd/6 ") {
		t.Errorf("a restore with a stub: %s", got)
	}
	if got := strings.Join(c.QEMUArgs(Launch{RAMFD: 5}), " "); !strings.Contains(got, "-kernel /img/vmlinuz ") {
		t.Errorf("a boot: %s", got)
	}
}
