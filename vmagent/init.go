package vmagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// mountSpec is one filesystem PID 1 mounts.
type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

// systemMounts are the kernel filesystems every root needs: the initramfs
// at boot, and the image's root after Setup.
var systemMounts = []mountSpec{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
	{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
}

// cgroupMount is added in the image's root: container runtimes need the
// unified hierarchy there.
var cgroupMount = mountSpec{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""}

// mountAll mounts specs under root, making each target first. A target that
// is already a mount of that type is left alone.
func mountAll(root string, specs []mountSpec) error {
	for _, m := range specs {
		target := filepath.Join(root, m.target)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("mount %s: %w", target, err)
		}
		if err := unix.Mount(m.source, target, m.fstype, m.flags, m.data); err != nil {
			if errors.Is(err, unix.EBUSY) {
				continue // mounted already, by the kernel or an earlier run
			}
			return fmt.Errorf("mount %s on %s: %w", m.fstype, target, err)
		}
	}
	return nil
}

// openConsole gives PID 1 its stdio on /dev/console when the kernel could
// not (an initramfs without a /dev/console node): the log goes there.
func openConsole() {
	if _, err := unix.FcntlInt(2, unix.F_GETFD, 0); err == nil {
		return
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for i := 0; i <= 2; i++ {
		if fd != i {
			unix.Dup3(fd, i, 0)
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// bootConfig is what the host says on the kernel command line.
type bootConfig struct {
	transport string // "serial" or "vsock"
	port      uint32 // the vsock port
}

// parseCmdline reads agentconnect.transport= and agentconnect.port= from a
// kernel command line; anything else on it is ignored.
func parseCmdline(cmdline string) (bootConfig, error) {
	cfg := bootConfig{transport: "serial", port: vmtransport.DefaultPort}
	for _, arg := range splitCmdline(cmdline) {
		key, value, _ := strings.Cut(arg, "=")
		switch key {
		case "agentconnect.transport":
			if value != "serial" && value != "vsock" {
				return cfg, fmt.Errorf("kernel command line: agentconnect.transport=%q: want serial or vsock", value)
			}
			cfg.transport = value
		case "agentconnect.port":
			port, err := strconv.ParseUint(value, 10, 32)
			if err != nil || port == 0 || port == unix.VMADDR_PORT_ANY {
				return cfg, fmt.Errorf("kernel command line: agentconnect.port=%q: want a vsock port number", value)
			}
			cfg.port = uint32(port)
		}
	}
	return cfg, nil
}

// splitCmdline splits a command line as the kernel does: on spaces, except
// inside double quotes, which are removed.
func splitCmdline(s string) []string {
	var args []string
	var cur strings.Builder
	inQuote, inArg := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			inArg = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// uptime is the time since the kernel started, suspend included.
func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// powerOff syncs the disks and powers the VM off; QEMU, run with
// -no-reboot, then exits with status 0. It returns only on failure.
func powerOff() error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		return fmt.Errorf("power off: %w", err)
	}
	return nil
}
