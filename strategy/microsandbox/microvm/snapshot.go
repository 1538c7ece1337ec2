package microvm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// AgentPortID is the QEMU id of the guest agent's serial port: QMP names it
// in VSERPORT_CHANGE when the guest agent opens it.
const AgentPortID = "agentport"

// Snapshots says whether c's VM can be saved and restored: a VM on the
// serial transport gets the layout for it (its RAM a file the shim holds,
// a QMP monitor, its shares plugged in once it runs). vsock's device state
// is the host kernel's, which QEMU cannot restore into another VM.
func (c Config) Snapshots() bool { return c.Transport == "serial" }

// QMPSocket is where QEMU serves its QMP monitor, for a VM with snapshots.
func (c Config) QMPSocket() string { return c.qmpSocket() }

func sharePort(i int) string { return "rp" + strconv.Itoa(i) }

// ShareHotplug is the QMP arguments that plug share i into a VM with
// snapshots: chardev-add's (a client of its virtiofsd's socket) and
// device_add's (its vhost-user-fs device, on the share's root port).
func (c Config) ShareHotplug(i int) (chardev, device map[string]any) {
	id := "fs" + strconv.Itoa(i)
	chardev = map[string]any{"id": id, "backend": map[string]any{"type": "socket", "data": map[string]any{
		"addr": map[string]any{"type": "unix", "data": map[string]any{"path": c.shareSocket(i)}}, "server": false}}}
	device = map[string]any{"driver": "vhost-user-fs-pci", "id": id + "dev", "chardev": id, "tag": c.Shares[i].Tag, "bus": sharePort(i)}
	return chardev, device
}

// SnapshotKey names the snapshots c's VM can be restored from: everything
// the guest saw when it booted. QEMU's command line (but the VM's own paths:
// its disks and sockets), the disks' size, the image's content and the files
// of QEMU, the kernel and the initramfs (the guest agent) as they are on disk
// now. Two VMs with the same key boot to the same state, so one's snapshot is
// the other's boot.
func (c Config) SnapshotKey(qemu string) (string, error) {
	norm := c
	norm.Dir, norm.RunDir, norm.Hidden = "/vm", "/run", nil
	norm.Shares = make([]session.VMShare, len(c.Shares)) // their count is the guest's; the rest plugs in later
	type file struct {
		Path        string
		Size, MTime int64
		Ino         uint64
	}
	key := struct {
		Args          []string
		Image         string
		DiskGiB       int
		Files         []file
		LayoutVersion int
	}{Args: norm.QEMUArgs(Launch{RAMFD: 5}), Image: c.ImageDigest, DiskGiB: c.DiskGiB, LayoutVersion: 1}
	for _, p := range []string{qemu, c.Kernel, c.Initrd} {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("snapshot key: %w", err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		key.Files = append(key.Files, file{Path: p, Size: fi.Size(), MTime: fi.ModTime().UnixNano(), Ino: st.Ino})
	}
	b, err := json.Marshal(key)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// KernelStub is what a restored VM's QEMU loads as its kernel: the boot
// header of c.Kernel (a bzImage: its real-mode sectors) and one page of
// zeros in place of the kernel itself, or nil when c.Kernel is no bzImage.
// QEMU reads the whole kernel into its own memory and keeps it there for
// the VM's life (~14 MiB of every VM, for a reboot's firmware to load
// again); a restored guest's kernel is in its RAM already, the firmware
// has run, and a reboot ends QEMU (-no-reboot). The header is the real
// one, so QEMU lays out the same option ROM and memory as at the boot the
// snapshot was taken of.
func (c Config) KernelStub() ([]byte, error) {
	f, err := os.Open(c.Kernel)
	if err != nil {
		return nil, fmt.Errorf("the kernel's boot header: %w", err)
	}
	defer f.Close()
	// The boot protocol's header: setup_sects at 0x1f1, "HdrS" at 0x202.
	head := make([]byte, 0x206)
	if _, err := io.ReadFull(f, head); err != nil {
		return nil, fmt.Errorf("the kernel's boot header in %s: %w", c.Kernel, err)
	}
	if string(head[0x202:0x206]) != "HdrS" {
		return nil, nil
	}
	sects := int(head[0x1f1])
	if sects == 0 {
		sects = 4 // the protocol's meaning of 0
	}
	stub := make([]byte, (sects+1)*512+4096)
	if _, err := f.ReadAt(stub[:(sects+1)*512], 0); err != nil {
		return nil, fmt.Errorf("the kernel's boot header in %s: %w", c.Kernel, err)
	}
	return stub, nil
}
