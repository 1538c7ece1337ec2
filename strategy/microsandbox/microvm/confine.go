package microvm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"syscall"

	"github.com/agentconnect-md/agentconnect/internal/protect"
)

// ConfinedArgs is bwrap's command line (after "bwrap") that runs QEMU with
// the view it needs and no more: the system read-only, the daemon's home
// (and whatever else is Hidden) replaced by an empty tmpfs in which only the
// VM's own files come back — its disks, its sockets, its image — and
// /dev/kvm and /dev/vhost-vsock when used; no network (its NIC is a unix
// socket) and no other process in sight. QEMU's own -sandbox on (seccomp)
// applies inside.
func (c Config) ConfinedArgs(qemu string, l Launch) []string {
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
	return append(append(args, "--", qemu), c.QEMUArgs(l)...)
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

// ShareTarget is where a share is bound in its virtiofsd's view, and what
// virtiofsd serves.
const ShareTarget = "/run/agentconnect/share"

// shimTarget is where the shim binary is bound in virtiofsd's view, to run
// share-exec.
const shimTarget = "/run/agentconnect/agentconnect-shim"

// virtiofsdCaps are the capabilities QEMU's C virtiofsd needs: its own
// sandbox (new mount, pid and net namespaces, pivot_root into the share,
// dropping capabilities) and serving files of any owner. Everything else is
// dropped before it runs.
var virtiofsdCaps = []string{
	"CAP_SYS_ADMIN", "CAP_SYS_CHROOT", "CAP_SETPCAP",
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_SETGID", "CAP_SETUID", "CAP_MKNOD", "CAP_SETFCAP",
}

// VirtiofsdLaunch is how share i's virtiofsd starts: bwrap's command line
// (after "bwrap") and the files it names, to be passed at fds 3 and up. The
// share is bound from its fd (binds[0], the share's root; then, for a
// writable share, its git directories and protected names, read-only) at
// ShareTarget, which is all virtiofsd serves: so the guest, root in its own
// kernel, can neither write a protected name nor undo the mounts that
// protect it. virtiofsd runs with the system read-only, the daemon's home
// and every home hidden, no network, its own pid namespace and only the
// capabilities it needs; share-exec checks the binds (protect.Verify, with
// checks at fd 3) before it execs virtiofsd.
func (c Config) VirtiofsdLaunch(virtiofsd string, i int, shim *os.File, binds []protect.Bind, checks *os.File) ([]string, []*os.File) {
	files := []*os.File{checks}
	fd := func(f *os.File) string {
		files = append(files, f)
		return strconv.Itoa(3 + len(files) - 1)
	}
	args := []string{
		"--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-pid",
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run",
	}
	hidden := append([]string(nil), c.Hidden...)
	sort.Strings(hidden)
	for _, h := range hidden {
		args = append(args, "--tmpfs", h)
	}
	args = append(args, "--bind", c.RunDir, c.RunDir, "--ro-bind-fd", fd(shim), shimTarget)
	for _, b := range binds {
		op := "--bind-fd"
		if b.ReadOnly {
			op = "--ro-bind-fd"
		}
		args = append(args, op, fd(b.File), b.Target)
	}
	args = append(args, "--cap-drop", "ALL")
	for _, cp := range virtiofsdCaps {
		args = append(args, "--cap-add", cp)
	}
	args = append(args, "--", shimTarget, "share-exec", "--",
		virtiofsd, "--socket-path="+c.shareSocket(i), "-o", "source="+ShareTarget, "-o", "cache=none", "-o", "log_level=warn")
	return args, files
}

// idMax is the number of valid ids: 0 to 2^32-2 (2^32-1 is "no id").
const idMax = 1<<32 - 1

// ShareIDMap is the uid (or gid) map of the user namespace a share's
// virtiofsd runs in: the identity, but for the guest's runtime id and the
// owner of the share's root, which trade places. QEMU 7.2's virtiofsd
// creates files with the guest's ids and reports the host's, and has no
// option to translate them: in this namespace the runtime user owns the
// share as the host user owns it, what it creates belongs to that host
// user, and guest root is host root everywhere else (or, on a share that
// root owns, the runtime id: never more than root). Every id stays mapped,
// so virtiofsd's capabilities cover every file.
func ShareIDMap(guest, owner uint32) []syscall.SysProcIDMap {
	if guest == owner {
		return []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: idMax}}
	}
	lo, hi := min(guest, owner), max(guest, owner)
	m := []syscall.SysProcIDMap{}
	add := func(inside, host, size int) {
		if size > 0 {
			m = append(m, syscall.SysProcIDMap{ContainerID: inside, HostID: host, Size: size})
		}
	}
	add(0, 0, int(lo))
	add(int(lo), int(hi), 1)
	add(int(lo)+1, int(lo)+1, int(hi-lo)-1)
	add(int(hi), int(lo), 1)
	add(int(hi)+1, int(hi)+1, idMax-int(hi)-1)
	return m
}

// ShareExec is `agentconnect-shim share-exec -- PROGRAM ARGS...`, inside
// virtiofsd's bwrap: it checks that the share's binds landed where they
// should (the checks at fd 3), then execs PROGRAM.
func ShareExec(args []string) error {
	if len(args) < 2 || args[0] != "--" {
		return errors.New("usage: share-exec -- PROGRAM [ARG...]")
	}
	checks, err := protect.ReadChecks(3)
	if err == nil {
		err = protect.Verify(checks)
	}
	if err != nil {
		return fmt.Errorf("share-exec: %w", err)
	}
	return fmt.Errorf("share-exec: exec %s: %w", args[1], syscall.Exec(args[1], args[1:], os.Environ()))
}

// ShareSocket is where virtiofsd of share i listens.
func (c Config) ShareSocket(i int) string { return c.shareSocket(i) }

// AgentSocket is where QEMU listens for the shim, with the serial transport.
func (c Config) AgentSocket() string { return c.agentSocket() }

// NetSocket is where the shim listens for QEMU's NIC.
func (c Config) NetSocket() string { return c.netSocket() }
