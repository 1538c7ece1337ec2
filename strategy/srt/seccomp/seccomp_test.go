//go:build linux && amd64

package seccomp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// The live tests install the filter in a child: the test binary re-executed
// with envProbe naming a probe. The child installs the filter (or not, in mode
// "none", the control that shows the probe would notice a missing rule), makes
// the call and prints "errno=N" (0 for success).
const (
	envProbe = "AGENTCONNECT_SECCOMP_PROBE"
	envMode  = "AGENTCONNECT_SECCOMP_MODE" // none, default or nested
	envDir   = "AGENTCONNECT_SECCOMP_DIR"  // for the mount probes
	// envHostMntns names the test's mount namespace, where no probe may mount.
	envHostMntns = "AGENTCONNECT_SECCOMP_HOST_MNTNS"
)

const childTimeout = 30 * time.Second

func TestMain(m *testing.M) {
	if name := os.Getenv(envProbe); name != "" {
		os.Exit(runProbe(name, os.Getenv(envMode)))
	}
	os.Exit(m.Run())
}

// probeFunc makes its call after calling install, and returns the errno.
type probeFunc func(install func()) unix.Errno

// allDenied names the probe that makes every call of denied in one child,
// after one install, and prints "NAME errno=N" for each: three children for
// the whole list instead of three per call (each child of a -race test
// binary costs about a second here). The calls are harmless together as they
// are alone.
const allDenied = "all-denied"

func runProbe(name, mode string) int {
	if name == allDenied {
		install(mode)
		for _, p := range denied {
			fmt.Printf("%s errno=%d\n", p.name, int(p.call()))
		}
		return 0
	}
	p := findProbe(name)
	if p == nil {
		fmt.Fprintf(os.Stderr, "unknown probe %q\n", name)
		return 2
	}
	fmt.Printf("errno=%d\n", int(p(func() { install(mode) })))
	return 0
}

// install loads the filter for mode, or nothing for "none".
func install(mode string) {
	switch mode {
	case "none":
	case "default", "nested":
		if err := Install(Options{NestedSandbox: mode == "nested"}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", mode)
		os.Exit(2)
	}
}

func findProbe(name string) probeFunc {
	for _, p := range denied {
		if p.name == name {
			return simple(p.call)
		}
	}
	for _, p := range allowed {
		if p.name == name {
			return simple(p.call)
		}
	}
	return special[name]
}

func simple(call func() unix.Errno) probeFunc {
	return func(install func()) unix.Errno {
		install()
		return call()
	}
}

// child runs probe in a fresh test binary.
func child(t *testing.T, probe, mode string, env ...string) (stdout string, err error) {
	t.Helper()
	return childWith(t, nil, probe, mode, env...)
}

// childWith runs probe in a fresh test binary started with attr.
func childWith(t *testing.T, attr *syscall.SysProcAttr, probe, mode string, env ...string) (stdout string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.SysProcAttr = attr
	cmd.Env = append(os.Environ(), envProbe+"="+probe, envMode+"="+mode)
	cmd.Env = append(cmd.Env, env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if errOut.Len() > 0 {
		t.Logf("probe %s (%s) stderr:\n%s", probe, mode, errOut.String())
	}
	return out.String(), err
}

// childErrno runs probe and returns the errno it printed.
func childErrno(t *testing.T, probe, mode string, env ...string) unix.Errno {
	t.Helper()
	out, err := child(t, probe, mode, env...)
	if err != nil {
		t.Fatalf("probe %s (%s): %v", probe, mode, err)
	}
	s, ok := strings.CutPrefix(strings.TrimSpace(out), "errno=")
	n, convErr := strconv.Atoi(s)
	if !ok || convErr != nil {
		t.Fatalf("probe %s (%s) printed %q, want errno=N", probe, mode, out)
	}
	return unix.Errno(n)
}

// childErrnos runs every denied probe in one child and returns the errno of
// each; a probe missing from the output fails the test.
func childErrnos(t *testing.T, mode string) map[string]unix.Errno {
	t.Helper()
	out, err := child(t, allDenied, mode)
	if err != nil {
		t.Fatalf("probes (%s): %v", mode, err)
	}
	got := map[string]unix.Errno{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, rest, _ := strings.Cut(line, " ")
		s, ok := strings.CutPrefix(rest, "errno=")
		n, convErr := strconv.Atoi(s)
		if !ok || convErr != nil {
			t.Fatalf("probes (%s) printed %q, want NAME errno=N", mode, line)
		}
		got[name] = unix.Errno(n)
	}
	for _, p := range denied {
		if _, ok := got[p.name]; !ok {
			t.Fatalf("probes (%s): no result for %s in %q", mode, p.name, out)
		}
	}
	return got
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "success"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return strconv.Itoa(int(e))
}

// atFdcwd is AT_FDCWD sign-extended, as a C caller passes it.
var atFdcwd = func() uintptr { fd := unix.AT_FDCWD; return uintptr(fd) }()

// The probes' arguments are chosen so that, without the filter, the calls
// fail harmlessly (or succeed on a throwaway fd) with something other than
// EPERM when run as root. Pointers are converted to uintptr in the call
// expression itself, which keeps them alive until the call returns.
const (
	badFd     = ^uintptr(0) // -1
	noSuchPid = 0x3fffffff  // above PID_MAX_LIMIT
	highBits  = uintptr(1) << 32
	noSuchDir = "/nonexistent/agentconnect-seccomp-probe"
)

func errnoOf(_, _ uintptr, e unix.Errno) unix.Errno { return e }

// closeFd closes the fd a successful call returned.
func closeFd(fd, _ uintptr, e unix.Errno) unix.Errno {
	if e == 0 {
		unix.Close(int(fd))
	}
	return e
}

func cstr(s string) *byte {
	p, err := unix.BytePtrFromString(s)
	if err != nil {
		panic(err)
	}
	return p
}

type syscallProbe struct {
	name string
	call func() unix.Errno
	// want is the errno with the filter installed.
	want unix.Errno
	// nested probes are allowed with NestedSandbox: the result must then be
	// the same as without a filter.
	nested bool
	// hostMayDeny marks calls the host itself may refuse with the same errno
	// (kernel lockdown, sysctls, not running as root), so that the control
	// without the filter is not conclusive there.
	hostMayDeny bool
}

var denied = []syscallProbe{
	// A nested sandbox brings up its loopback over netlink: lifted with it.
	{name: "socket-netlink", want: unix.EPERM, nested: true, call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE))
	}},
	{name: "socket-vsock", want: unix.EPERM, call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0))
	}},
	{name: "io_uring_setup", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		params := new([120]byte) // struct io_uring_params, zeroed
		return closeFd(unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(params)), 0))
	}},
	{name: "io_uring_enter", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_IO_URING_ENTER, badFd, 0, 0, 0, 0, 0))
	}},
	{name: "io_uring_register", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_IO_URING_REGISTER, badFd, 0, 0, 0, 0, 0))
	}},
	{name: "ptrace", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, noSuchPid, 0, 0, 0, 0))
	}},
	{name: "process_vm_readv", want: unix.EPERM, call: func() unix.Errno {
		buf := new([8]byte)
		local := &unix.Iovec{Base: &buf[0], Len: 8}
		remote := &unix.Iovec{Base: &buf[0], Len: 8}
		return errnoOf(unix.Syscall6(unix.SYS_PROCESS_VM_READV, noSuchPid, uintptr(unsafe.Pointer(local)), 1, uintptr(unsafe.Pointer(remote)), 1, 0))
	}},
	{name: "process_vm_writev", want: unix.EPERM, call: func() unix.Errno {
		buf := new([8]byte)
		local := &unix.Iovec{Base: &buf[0], Len: 8}
		remote := &unix.Iovec{Base: &buf[0], Len: 8}
		return errnoOf(unix.Syscall6(unix.SYS_PROCESS_VM_WRITEV, noSuchPid, uintptr(unsafe.Pointer(local)), 1, uintptr(unsafe.Pointer(remote)), 1, 0))
	}},
	{name: "bpf", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_BPF, 9999, 0, 0)) // unknown command
	}},
	{name: "perf_event_open", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, badFd, badFd, 0, 0)) // NULL attr
	}},
	{name: "userfaultfd", want: unix.EPERM, call: func() unix.Errno {
		// UFFD_USER_MODE_ONLY passes the privilege check; bit 30 is an unknown flag.
		return closeFd(unix.Syscall(unix.SYS_USERFAULTFD, 1|1<<30, 0, 0))
	}},
	{name: "keyctl", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_KEYCTL, 9999, 0, 0, 0, 0, 0)) // unknown operation
	}},
	{name: "add_key", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_ADD_KEY, 0, 0, 0, 0, 0, 0)) // NULL type
	}},
	{name: "request_key", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_REQUEST_KEY, 0, 0, 0, 0, 0, 0)) // NULL type
	}},
	{name: "kexec_load", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 1<<20, 0, 0, 0, 0)) // more than KEXEC_SEGMENT_MAX segments
	}},
	{name: "kexec_file_load", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_KEXEC_FILE_LOAD, badFd, badFd, 0, 0, 1<<31, 0)) // unknown flag
	}},
	{name: "init_module", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)) // empty image
	}},
	{name: "finit_module", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_FINIT_MODULE, badFd, 0, 0))
	}},
	{name: "delete_module", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		name := cstr("agentconnect_no_such_module")
		return errnoOf(unix.Syscall(unix.SYS_DELETE_MODULE, uintptr(unsafe.Pointer(name)), 0, 0))
	}},
	{name: "pidfd_getfd", want: unix.EPERM, call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_PIDFD_GETFD, badFd, 0, 0))
	}},
	{name: "kcmp", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_KCMP, noSuchPid, noSuchPid, 0, 0, 0, 0)) // KCMP_FILE
	}},
	{name: "process_madvise", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_PROCESS_MADVISE, badFd, 0, 0, 0, 0, 0))
	}},
	{name: "migrate_pages", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_MIGRATE_PAGES, noSuchPid, 0, 0, 0, 0, 0))
	}},
	{name: "move_pages", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_MOVE_PAGES, noSuchPid, 0, 0, 0, 0, 0))
	}},
	{name: "mbind", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_MBIND, 0, 0, 99, 0, 0, 0)) // unknown mode
	}},
	{name: "set_mempolicy", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_SET_MEMPOLICY, 99, 0, 0)) // unknown mode
	}},
	{name: "set_mempolicy_home_node", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_SET_MEMPOLICY_HOME_NODE, 0, 0, 0, 1, 0, 0)) // unknown flag
	}},
	{name: "open_by_handle_at", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_OPEN_BY_HANDLE_AT, badFd, 0, 0)) // NULL handle
	}},
	{name: "name_to_handle_at", want: unix.EPERM, call: func() unix.Errno {
		dir := cstr(noSuchDir)
		return errnoOf(unix.Syscall6(unix.SYS_NAME_TO_HANDLE_AT, atFdcwd, uintptr(unsafe.Pointer(dir)), 0, 0, 0, 0))
	}},
	{name: "fanotify_init", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_FANOTIFY_INIT, 1<<31, 0, 0)) // unknown flag
	}},
	// Any persona but the harmless few; in this child it would only change the child.
	{name: "personality-mmap-page-zero", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_PERSONALITY, 0x0100000, 0, 0)) // MMAP_PAGE_ZERO
	}},
	{name: "personality-addr-no-randomize", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_PERSONALITY, 0x0040000, 0, 0)) // ADDR_NO_RANDOMIZE
	}},
	// Gone from today's kernels (ENOSYS without the filter).
	{name: "create_module", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_CREATE_MODULE, 0, 0, 0))
	}},
	{name: "get_kernel_syms", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_GET_KERNEL_SYMS, 0, 0, 0))
	}},
	{name: "query_module", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_QUERY_MODULE, 0, 0, 0, 0, 0, 0))
	}},
	{name: "nfsservctl", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_NFSSERVCTL, 0, 0, 0))
	}},
	{name: "_sysctl", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS__SYSCTL, 0, 0, 0))
	}},
	{name: "lookup_dcookie", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_LOOKUP_DCOOKIE, 0, 0, 0))
	}},
	{name: "uselib", want: unix.EPERM, call: func() unix.Errno {
		lib := cstr(noSuchDir)
		return errnoOf(unix.Syscall(unix.SYS_USELIB, uintptr(unsafe.Pointer(lib)), 0, 0))
	}},
	{name: "sysfs", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_SYSFS, 99, 0, 0)) // unknown option
	}},
	{name: "ustat", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_USTAT, 0, 0, 0)) // no device 0
	}},
	// Each of these would change the host as root without the filter; the
	// arguments make the kernel refuse before anything changes.
	{name: "reboot", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_REBOOT, 0, 0, 0, 0, 0, 0)) // wrong magic
	}},
	{name: "swapon", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		path := cstr(noSuchDir)
		return errnoOf(unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(path)), 0, 0))
	}},
	{name: "swapoff", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		path := cstr(noSuchDir)
		return errnoOf(unix.Syscall(unix.SYS_SWAPOFF, uintptr(unsafe.Pointer(path)), 0, 0))
	}},
	{name: "acct", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		path := cstr(noSuchDir) // opened before accounting changes; NULL would turn it off
		return errnoOf(unix.Syscall(unix.SYS_ACCT, uintptr(unsafe.Pointer(path)), 0, 0))
	}},
	{name: "quotactl", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_QUOTACTL, 0, 0, 0, 0, 0, 0)) // no device
	}},
	{name: "quotactl_fd", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_QUOTACTL_FD, badFd, 0, 0, 0, 0, 0))
	}},
	{name: "vhangup", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		// Without a controlling terminal there is nothing to hang up.
		if _, err := unix.Setsid(); err != nil {
			fmt.Fprintln(os.Stderr, "setsid:", err)
			return unix.EIO
		}
		return errnoOf(unix.Syscall(unix.SYS_VHANGUP, 0, 0, 0))
	}},
	{name: "settimeofday", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_SETTIMEOFDAY, 0, 0, 0)) // neither time nor zone: changes nothing
	}},
	{name: "clock_settime", want: unix.EPERM, call: func() unix.Errno {
		ts := new(unix.Timespec)
		return errnoOf(unix.Syscall(unix.SYS_CLOCK_SETTIME, 100, uintptr(unsafe.Pointer(ts)), 0)) // no such clock
	}},
	{name: "adjtimex", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_ADJTIMEX, 0, 0, 0)) // NULL timex
	}},
	{name: "clock_adjtime", want: unix.EPERM, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_CLOCK_ADJTIME, 100, 0, 0)) // no such clock, NULL timex
	}},
	{name: "syslog", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_SYSLOG, 9999, 0, 0)) // unknown action
	}},
	{name: "iopl", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_IOPL, 4, 0, 0)) // levels go to 3
	}},
	{name: "ioperm", want: unix.EPERM, hostMayDeny: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_IOPERM, 1<<16, 1, 1)) // past the last port
	}},

	// A Go process is multithreaded, so unshare(CLONE_NEWUSER) fails with
	// EINVAL without the filter; clone with CLONE_NEWUSER|CLONE_FS and clone3
	// with a NULL struct fail with EINVAL before creating anything.
	{name: "unshare-newuser", want: unix.EPERM, nested: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0))
	}},
	{name: "clone-newuser", want: unix.EPERM, nested: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS, 0, 0, 0, 0, 0))
	}},
	{name: "clone3", want: unix.ENOSYS, nested: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0))
	}},
	{name: "setns", want: unix.EPERM, nested: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_SETNS, badFd, unix.CLONE_NEWUSER, 0))
	}},
	{name: "mount", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		src, target, fstype := cstr("none"), cstr(noSuchDir), cstr("tmpfs")
		return errnoOf(unix.Syscall6(unix.SYS_MOUNT, uintptr(unsafe.Pointer(src)), uintptr(unsafe.Pointer(target)), uintptr(unsafe.Pointer(fstype)), 0, 0, 0))
	}},
	{name: "umount2", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		target := cstr(noSuchDir)
		return errnoOf(unix.Syscall(unix.SYS_UMOUNT2, uintptr(unsafe.Pointer(target)), 0, 0))
	}},
	{name: "pivot_root", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		dir := cstr(noSuchDir)
		return errnoOf(unix.Syscall(unix.SYS_PIVOT_ROOT, uintptr(unsafe.Pointer(dir)), uintptr(unsafe.Pointer(dir)), 0))
	}},
	{name: "open_tree", want: unix.EPERM, nested: true, call: func() unix.Errno {
		dir := cstr(noSuchDir)
		return closeFd(unix.Syscall(unix.SYS_OPEN_TREE, atFdcwd, uintptr(unsafe.Pointer(dir)), 0))
	}},
	{name: "open_tree_attr", want: unix.EPERM, nested: true, call: func() unix.Errno {
		dir := cstr(noSuchDir)
		return closeFd(unix.Syscall6(unix.SYS_OPEN_TREE_ATTR, atFdcwd, uintptr(unsafe.Pointer(dir)), 0, 0, 0, 0))
	}},
	{name: "move_mount", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		empty := cstr("")
		return errnoOf(unix.Syscall6(unix.SYS_MOVE_MOUNT, badFd, uintptr(unsafe.Pointer(empty)), badFd, uintptr(unsafe.Pointer(empty)), 0, 0))
	}},
	{name: "fsopen", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		fstype := cstr("agentconnect-no-such-fs")
		return closeFd(unix.Syscall(unix.SYS_FSOPEN, uintptr(unsafe.Pointer(fstype)), 0, 0))
	}},
	{name: "fsconfig", want: unix.EPERM, nested: true, call: func() unix.Errno {
		return errnoOf(unix.Syscall6(unix.SYS_FSCONFIG, badFd, 0, 0, 0, 0, 0))
	}},
	{name: "fsmount", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_FSMOUNT, badFd, 0, 0))
	}},
	{name: "fspick", want: unix.EPERM, nested: true, hostMayDeny: true, call: func() unix.Errno {
		empty := cstr("")
		return closeFd(unix.Syscall(unix.SYS_FSPICK, badFd, uintptr(unsafe.Pointer(empty)), 0))
	}},
	{name: "mount_setattr", want: unix.EPERM, nested: true, call: func() unix.Errno {
		empty := cstr("")
		return errnoOf(unix.Syscall6(unix.SYS_MOUNT_SETATTR, badFd, uintptr(unsafe.Pointer(empty)), 0, 0, 0, 0))
	}},
}

// TestDenied checks each refused call in a child: the filter returns the
// errno (also with NestedSandbox unless the rule is lifted there), and the
// same call without a filter returns something else, so the probe would
// notice the rule missing.
func TestDenied(t *testing.T) {
	root := os.Geteuid() == 0
	results := map[string]map[string]unix.Errno{}
	for _, mode := range []string{"none", "default", "nested"} {
		results[mode] = childErrnos(t, mode)
	}
	for _, p := range denied {
		t.Run(p.name, func(t *testing.T) {
			control := results["none"][p.name]
			switch {
			case control != p.want:
			case root && !p.hostMayDeny:
				t.Errorf("without a filter %s = %s, the same as the filter: the probe proves nothing", p.name, errnoName(control))
			default:
				t.Logf("control inconclusive: this host refuses %s with %s without a filter", p.name, errnoName(control))
			}

			if got := results["default"][p.name]; got != p.want {
				t.Errorf("%s with the default filter = %s, want %s", p.name, errnoName(got), errnoName(p.want))
			}

			want := p.want
			if p.nested {
				want = control
			}
			if got := results["nested"][p.name]; got != want {
				t.Errorf("%s with NestedSandbox = %s, want %s", p.name, errnoName(got), errnoName(want))
			}
		})
	}
}

var allowed = []syscallProbe{
	// The sandbox's own unix sockets: the host's are hidden from its view
	// (sandbox.hostSockets), and abstract ones belong to its network
	// namespace.
	{name: "socket-unix", call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0))
	}},
	// The kernel truncates the domain to an int: 1|1<<32 is AF_UNIX.
	{name: "socket-unix-high-bits", call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_UNIX|highBits, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0))
	}},
	// Node's child_process talks to its children over socketpairs.
	{name: "socketpair-unix", call: func() unix.Errno {
		fds := new([2]int32)
		_, _, e := unix.Syscall6(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0, uintptr(unsafe.Pointer(fds)), 0, 0)
		if e == 0 {
			unix.Close(int(fds[0]))
			unix.Close(int(fds[1]))
		}
		return e
	}},
	{name: "socket-inet", call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0))
	}},
	{name: "socket-inet-high-bits", call: func() unix.Errno {
		return closeFd(unix.Syscall(unix.SYS_SOCKET, unix.AF_INET|highBits, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0))
	}},
	// The personas docker allows, and the query.
	{name: "personality-query", call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0))
	}},
	{name: "personality-linux32", call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_PERSONALITY, 0x0008, 0, 0))
	}},
	{name: "personality-linux", call: func() unix.Errno {
		return errnoOf(unix.Syscall(unix.SYS_PERSONALITY, 0, 0, 0))
	}},
	{name: "exec-true", call: func() unix.Errno {
		return execErrno(exec.Command("/bin/true").Run())
	}},
	// The Go runtime keeps making threads with clone after the filter is in.
	{name: "new-threads", call: func() unix.Errno {
		const n = 8
		var wg sync.WaitGroup
		tids := make(chan int, n)
		release := make(chan struct{})
		for range n {
			wg.Go(func() {
				runtime.LockOSThread() // each goroutine holds a thread of its own
				defer runtime.UnlockOSThread()
				tids <- unix.Gettid()
				<-release
			})
		}
		seen := make(map[int]bool)
		for range n {
			seen[<-tids] = true
		}
		close(release)
		wg.Wait()
		if len(seen) != n {
			return unix.EAGAIN
		}
		return 0
	}},
}

func TestAllowed(t *testing.T) {
	for _, p := range allowed {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			for _, mode := range []string{"default", "nested"} {
				if got := childErrno(t, p.name, mode); got != 0 {
					t.Errorf("%s (%s) = %s, want success", p.name, mode, errnoName(got))
				}
			}
		})
	}
}

// execErrno maps an os/exec error to its errno: 0, the start errno, or EIO
// for a child that ran and failed.
func execErrno(err error) unix.Errno {
	var errno syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &errno):
		return unix.Errno(errno)
	default:
		fmt.Fprintln(os.Stderr, err)
		return unix.EIO
	}
}

var special = map[string]probeFunc{
	"tsync":        probeTSYNC,
	"x32-getpid":   probeX32,
	"int80-getpid": probeInt80,
	"mount-tmpfs": func(install func()) unix.Errno {
		install()
		return mountTmpfs(os.Getenv(envDir))
	},
	"nested-unshare": func(install func()) unix.Errno {
		install()
		return startMountInUserns(&syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS})
	},
	"nested-clone": func(install func()) unix.Errno {
		install()
		return startMountInUserns(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS})
	},
	// A runtime's own bubblewrap sandbox, with its own network namespace
	// (the form Codex runs): bwrap brings its loopback up over netlink.
	"bwrap": func(install func()) unix.Errno {
		install()
		cmd := exec.Command("bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
			"--unshare-cgroup", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
			"--tmpfs", "/tmp", "--", "/bin/true")
		cmd.Stderr = os.Stderr
		return execErrno(cmd.Run())
	},
}

// probeTSYNC makes the call from a thread that existed, locked to its
// goroutine, before Install ran on another thread. It also checks that every
// thread reports the filter and no_new_privs in /proc.
func probeTSYNC(install func()) unix.Errno {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ready := make(chan int)
	installed := make(chan struct{})
	result := make(chan unix.Errno)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ready <- unix.Gettid()
		<-installed
		result <- readOwnMemory()
	}()
	if tid := <-ready; tid == unix.Gettid() {
		panic("the probe thread is the installing thread")
	}
	install()
	close(installed)
	e := <-result
	if os.Getenv(envMode) != "none" {
		if err := checkAllThreadsFiltered(); err != nil {
			panic(fmt.Sprintf("%v (process_vm_readv on the older thread: %s)", err, errnoName(e)))
		}
	}
	return e
}

// readOwnMemory reads a byte of this process with process_vm_readv, which
// the filter refuses in every mode and the kernel allows on oneself.
func readOwnMemory() unix.Errno {
	var src, dst byte = 1, 0
	local := unix.Iovec{Base: &dst, Len: 1}
	remote := unix.Iovec{Base: &src, Len: 1}
	_, _, e := unix.Syscall6(unix.SYS_PROCESS_VM_READV, uintptr(unix.Getpid()),
		uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
	return e
}

// checkAllThreadsFiltered reads every thread's seccomp mode and
// no_new_privs from /proc.
func checkAllThreadsFiltered() error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			return err
		}
		var mode, nnp string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Seccomp:"); ok {
				mode = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "NoNewPrivs:"); ok {
				nnp = strings.TrimSpace(v)
			}
		}
		if mode != "2" || nnp != "1" {
			return fmt.Errorf("thread %s of %d: Seccomp %q, NoNewPrivs %q; want 2 and 1", task.Name(), len(tasks), mode, nnp)
		}
	}
	return nil
}

// TestFilterCoversExistingThreads checks SECCOMP_FILTER_FLAG_TSYNC: a thread
// started before Install is filtered too.
func TestFilterCoversExistingThreads(t *testing.T) {
	t.Parallel()
	if got := childErrno(t, "tsync", "none"); got != 0 {
		t.Fatalf("process_vm_readv from another thread without a filter = %s, want success", errnoName(got))
	}
	for _, mode := range []string{"default", "nested"} {
		if got := childErrno(t, "tsync", mode); got != unix.EPERM {
			t.Errorf("process_vm_readv from a thread that predates Install (%s) = %s, want EPERM", mode, errnoName(got))
		}
	}
}

func noCoreDumps() {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		panic(err)
	}
}

func probeX32(install func()) unix.Errno {
	noCoreDumps()
	install()
	return errnoOf(unix.Syscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0))
}

// probeInt80 calls getpid through the i386 entry point (int 0x80), which a
// 64-bit process can use, with seccomp_data.arch set to AUDIT_ARCH_I386.
func probeInt80(install func()) unix.Errno {
	noCoreDumps()
	code := []byte{
		0x48, 0x89, 0xc1, // mov rcx, rax      (the *int32 argument, Go register ABI)
		0xb8, 20, 0, 0, 0, // mov eax, 20      (__NR_getpid on i386)
		0xcd, 0x80, // int 0x80
		0x89, 0x01, // mov [rcx], eax
		0xc3, // ret
	}
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		panic(err)
	}
	copy(mem, code)
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_EXEC); err != nil {
		panic(err)
	}
	entry := &mem[0]
	closure := &entry // a Go func value points to a word holding the code address
	call := *(*func(*int32))(unsafe.Pointer(&closure))
	install()
	// A kernel without ia32 emulation (ia32_emulation=0) answers int 0x80
	// with a general protection fault, before any filter sees it: reported
	// as faultOutput, the test skips.
	debug.SetPanicOnFault(true)
	defer func() {
		if recover() != nil {
			fmt.Print(faultOutput)
			os.Exit(0)
		}
	}()
	pid := new(int32)
	call(pid)
	if int(*pid) != os.Getpid() {
		fmt.Fprintf(os.Stderr, "int 0x80 getpid returned %d, pid is %d\n", *pid, os.Getpid())
		return unix.EIO
	}
	return 0
}

// faultOutput is what the int80-getpid probe prints when int 0x80 faults.
const faultOutput = "fault\n"

// killedBySIGSYS reports whether err is the exit of a child killed by SIGSYS.
func killedBySIGSYS(err error) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == unix.SIGSYS
}

func TestX32Killed(t *testing.T) {
	t.Parallel()
	out, err := child(t, "x32-getpid", "none")
	if err != nil {
		t.Fatalf("x32 getpid without a filter: %v (output %q), want a normal exit", err, out)
	}
	t.Logf("x32 getpid without a filter: %s", strings.TrimSpace(out))
	for _, mode := range []string{"default", "nested"} {
		if out, err := child(t, "x32-getpid", mode); !killedBySIGSYS(err) {
			t.Errorf("x32 getpid (%s): exit %v, output %q; want killed by SIGSYS", mode, err, out)
		}
	}
}

// TestI386Killed makes a real syscall with a foreign architecture: the arch
// check must kill the process before the number is read.
func TestI386Killed(t *testing.T) {
	t.Parallel()
	out, err := child(t, "int80-getpid", "none")
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Skipf("int 0x80 without a filter dies with %v: no ia32 emulation in this kernel", ws.Signal())
		}
	}
	if out == faultOutput {
		t.Skip("int 0x80 without a filter faults (SIGSEGV): this kernel has no ia32 emulation (ia32_emulation=0)")
	}
	if err != nil || strings.TrimSpace(out) != "errno=0" {
		t.Fatalf("int 0x80 getpid without a filter: %v, output %q; want errno=0", err, out)
	}
	for _, mode := range []string{"default", "nested"} {
		if out, err := child(t, "int80-getpid", mode); !killedBySIGSYS(err) {
			t.Errorf("int 0x80 getpid (%s): exit %v, output %q; want killed by SIGSYS", mode, err, out)
		}
	}
}

// mountTmpfs mounts a tmpfs on dir and unmounts it (when the filter lets
// it). It refuses to run in the test's own mount namespace, so that a filter
// that lets the mount through cannot leave it behind on the host.
func mountTmpfs(dir string) unix.Errno {
	host := os.Getenv(envHostMntns)
	if dir == "" || host == "" {
		panic("mount-tmpfs needs " + envDir + " and " + envHostMntns)
	}
	if self, err := os.Readlink("/proc/self/ns/mnt"); err != nil || self == host {
		panic(fmt.Sprintf("mount-tmpfs in the host mount namespace %s (%v)", host, err))
	}
	src, target, fstype := cstr("agentconnect-probe"), cstr(dir), cstr("tmpfs")
	e := errnoOf(unix.Syscall6(unix.SYS_MOUNT, uintptr(unsafe.Pointer(src)), uintptr(unsafe.Pointer(target)), uintptr(unsafe.Pointer(fstype)), 0, 0, 0))
	if e == 0 {
		unix.Unmount(dir, unix.MNT_DETACH)
	}
	return e
}

// startMountInUserns runs the mount-tmpfs probe in a child made with attr
// (a new user and mount namespace, root mapped to our ids) and returns the
// errno of whichever step failed.
func startMountInUserns(attr *syscall.SysProcAttr) unix.Errno {
	attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
	attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envProbe+"=mount-tmpfs", envMode+"=none") // the filter is inherited
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if e := execErrno(err); e != 0 {
		return e
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(string(out)), "errno="))
	if err != nil {
		panic(fmt.Sprintf("mount-tmpfs printed %q", out))
	}
	return unix.Errno(n)
}

// mountEnv returns the environment of the mount probes: a fresh directory
// to mount on and the test's own mount namespace, where they refuse to mount.
func mountEnv(t *testing.T) []string {
	t.Helper()
	mntns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	return []string{envDir + "=" + t.TempDir(), envHostMntns + "=" + mntns}
}

// TestNestedSandbox checks what a runtime's own bwrap needs: a new user and
// mount namespace (by unshare or by clone) and a tmpfs mounted inside it.
// Without NestedSandbox the namespace is refused.
func TestNestedSandbox(t *testing.T) {
	t.Parallel()
	env := mountEnv(t)
	for _, probe := range []string{"nested-unshare", "nested-clone"} {
		if got := childErrno(t, probe, "none", env...); got != 0 {
			t.Fatalf("%s without a filter = %s, want success (does this host allow user namespaces?)", probe, errnoName(got))
		}
		if got := childErrno(t, probe, "nested", env...); got != 0 {
			t.Errorf("%s with NestedSandbox = %s, want success", probe, errnoName(got))
		}
		if got := childErrno(t, probe, "default", env...); got != unix.EPERM {
			t.Errorf("%s with the default filter = %s, want EPERM", probe, errnoName(got))
		}
	}
}

// TestMountRefused mounts a tmpfs as root in a private mount namespace, where
// only the filter can refuse it.
func TestMountRefused(t *testing.T) {
	testutil.RequiresRoot(t)
	t.Parallel()
	env := mountEnv(t)
	attr := &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS}
	for _, c := range []struct {
		mode string
		want unix.Errno
	}{{"none", 0}, {"default", unix.EPERM}} {
		out, err := childWith(t, attr, "mount-tmpfs", c.mode, env...)
		if err != nil {
			t.Fatalf("mount-tmpfs (%s): %v", c.mode, err)
		}
		if got, want := strings.TrimSpace(out), fmt.Sprintf("errno=%d", c.want); got != want {
			t.Errorf("mounting a tmpfs (%s): %s, want %s (%s)", c.mode, got, want, errnoName(c.want))
		}
	}
}

// TestNestedBwrap runs the real thing: bwrap inside the filter.
func TestNestedBwrap(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap not installed")
	}
	t.Parallel()
	if got := childErrno(t, "bwrap", "none"); got != 0 {
		t.Skipf("bwrap fails on this host without a filter (%s)", errnoName(got))
	}
	if got := childErrno(t, "bwrap", "nested"); got != 0 {
		t.Errorf("bwrap with NestedSandbox = %s, want success", errnoName(got))
	}
	if got := childErrno(t, "bwrap", "default"); got == 0 {
		t.Error("bwrap with the default filter succeeded, want it refused")
	}
}
