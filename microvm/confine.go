package microvm

import (
	"errors"
	"os"
	"os/exec"
	"sort"
)

// ConfinedArgs is bwrap's command line (after "bwrap") that runs QEMU with
// the view it needs and no more: the system read-only, the daemon's home
// (and whatever else is Hidden) replaced by an empty tmpfs in which only the
// VM's own files come back — its disks, its sockets, its image — and
// /dev/kvm and /dev/vhost-vsock when used; no network (its NIC is a unix
// socket) and no other process in sight. QEMU's own -sandbox on (seccomp)
// applies inside.
func (c Config) ConfinedArgs(qemu string) []string {
	args := []string{
		"--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-pid",
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
	}
	if c.Accelerator == "kvm" {
		args = append(args, "--dev-bind", "/dev/kvm", "/dev/kvm")
	}
	if c.Transport == "vsock" {
		args = append(args, "--dev-bind", "/dev/vhost-vsock", "/dev/vhost-vsock")
	}
	hidden := append([]string(nil), c.Hidden...)
	sort.Strings(hidden)
	for _, h := range hidden {
		args = append(args, "--tmpfs", h)
	}
	for _, f := range []string{c.Kernel, c.Initrd, c.Rootfs} {
		args = append(args, "--ro-bind", f, f)
	}
	args = append(args, "--bind", c.Dir, c.Dir, "--bind", c.RunDir, c.RunDir)
	return append(append(args, "--", qemu), c.QEMUArgs()...)
}

// Tools are the host programs a VM needs.
type Tools struct {
	QEMU      string
	Virtiofsd string
	Bwrap     string
}

// virtiofsdPaths are where distributions install virtiofsd: QEMU's C one
// (Debian 12's QEMU 7.2), and the Rust one of newer releases.
var virtiofsdPaths = []string{"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd", "/usr/lib/virtiofsd"}

// FindTools finds QEMU, virtiofsd and bwrap, or says which is missing and
// how to install it.
func FindTools() (Tools, error) {
	var t Tools
	var err error
	if t.QEMU, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return t, errors.New("qemu-system-x86_64 is not installed: apt-get install qemu-system-x86")
	}
	for _, p := range virtiofsdPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			t.Virtiofsd = p
			break
		}
	}
	if t.Virtiofsd == "" {
		if t.Virtiofsd, err = exec.LookPath("virtiofsd"); err != nil {
			return t, errors.New("virtiofsd is not installed (it comes with qemu-system-x86 on Debian 12, or as the virtiofsd package)")
		}
	}
	if t.Bwrap, err = exec.LookPath("bwrap"); err != nil {
		return t, errors.New("bwrap is not installed (QEMU runs confined by it): apt-get install bubblewrap")
	}
	return t, nil
}

// VirtiofsdArgs is virtiofsd's command line for share i.
func (c Config) VirtiofsdArgs(virtiofsd string, i int) []string {
	return []string{virtiofsd, "--socket-path=" + c.shareSocket(i), "-o", "source=" + c.Shares[i].Source, "-o", "cache=none", "-o", "log_level=warn"}
}

// ShareSocket is where virtiofsd of share i listens.
func (c Config) ShareSocket(i int) string { return c.shareSocket(i) }

// AgentSocket is where QEMU listens for the shim, with the serial transport.
func (c Config) AgentSocket() string { return c.agentSocket() }

// NetSocket is where the shim listens for QEMU's NIC.
func (c Config) NetSocket() string { return c.netSocket() }
