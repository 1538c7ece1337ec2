package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data (include/uapi/linux/seccomp.h):
// int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
const (
	offNr   = 0
	offArch = 4
	offArgs = 16 // args[i] is at offArgs+8*i; on little-endian amd64 its low 32 bits come first
)

// Personas (include/uapi/linux/personality.h) that x/sys/unix does not name.
const (
	perLinux32 = 0x0008
	uname26    = 0x0020000
	perQuery   = 0xffffffff // personality(0xffffffff) only reads the current persona
)

// x32SyscallBit marks x32 ABI syscall numbers, which arrive with the x86_64
// arch token (arch/x86/include/uapi/asm/unistd.h __X32_SYSCALL_BIT).
const x32SyscallBit = 0x40000000

const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	// ENOSYS makes glibc and Go fall back from clone3 to clone, which the
	// filter can inspect.
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// rule refuses one syscall, or only the calls whose argument matches.
type rule struct {
	name string
	nr   uint32
	ret  uint32
	// arg, anyOf, anyBits and noneOf restrict the rule to calls whose
	// argument arg, compared on its low 32 bits, equals one of anyOf, has
	// one of anyBits set, or equals none of noneOf. With none of them,
	// every call matches.
	arg     int
	anyOf   []uint32
	anyBits uint32
	noneOf  []uint32
	// nested rules are lifted by Options.NestedSandbox.
	nested bool
	// nestedLifts are values of anyOf that Options.NestedSandbox allows.
	nestedLifts []uint32
}

func deny(name string, nr, ret uint32) rule {
	return rule{name: name, nr: nr, ret: ret}
}

// policy lists the refused syscalls; everything else is allowed. Each syscall
// appears at most once (its block ends in a return either way).
var policy = []rule{
	// Netlink reaches the kernel's configuration, vsock the hypervisor (domain: low 32 bits, an int). Unix sockets
	// are the sandbox's own: the host's are hidden from its view, and abstract ones belong to its network namespace.
	// A nested sandbox brings up its own loopback over netlink: that one is lifted with it.
	{name: "socket", nr: unix.SYS_SOCKET, ret: retEPERM, arg: 0,
		anyOf: []uint32{unix.AF_NETLINK, unix.AF_VSOCK}, nestedLifts: []uint32{unix.AF_NETLINK}},

	// IORING_OP_SOCKET and friends would run socket(2) without passing the filter.
	deny("io_uring_setup", unix.SYS_IO_URING_SETUP, retEPERM),
	deny("io_uring_enter", unix.SYS_IO_URING_ENTER, retEPERM),
	deny("io_uring_register", unix.SYS_IO_URING_REGISTER, retEPERM),

	// Reading or writing another process's memory, such as the sandbox's own helpers running as the same user.
	deny("ptrace", unix.SYS_PTRACE, retEPERM),
	deny("process_vm_readv", unix.SYS_PROCESS_VM_READV, retEPERM),
	deny("process_vm_writev", unix.SYS_PROCESS_VM_WRITEV, retEPERM),
	// Copying an open file out of another process (bwrap's, a helper's), under the same check as ptrace.
	deny("pidfd_getfd", unix.SYS_PIDFD_GETFD, retEPERM),
	// Comparing the kernel objects (files, memory, fs) of other processes: what ptrace would tell.
	deny("kcmp", unix.SYS_KCMP, retEPERM),
	// Advice (cold, pageout, collapse) on another process's memory.
	deny("process_madvise", unix.SYS_PROCESS_MADVISE, retEPERM),
	// Moving another process's pages between NUMA nodes.
	deny("migrate_pages", unix.SYS_MIGRATE_PAGES, retEPERM),
	deny("move_pages", unix.SYS_MOVE_PAGES, retEPERM),
	// Binding memory to NUMA nodes the host schedules for others (docker requires CAP_SYS_NICE).
	deny("mbind", unix.SYS_MBIND, retEPERM),
	deny("set_mempolicy", unix.SYS_SET_MEMPOLICY, retEPERM),
	deny("set_mempolicy_home_node", unix.SYS_SET_MEMPOLICY_HOME_NODE, retEPERM),

	// Opening any file of a filesystem by handle, past the directories that hide it: the "shocker" container escape.
	deny("open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, retEPERM),
	// Making the handles for it, which also expose inode and mount identities of the host's files.
	deny("name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT, retEPERM),
	// Watching filesystem events on the host's files (unprivileged since Linux 5.13).
	deny("fanotify_init", unix.SYS_FANOTIFY_INIT, retEPERM),

	// Personas other than Linux, 32-bit Linux and UNAME26 (docker's list, plus the query) turn off ASLR,
	// map page zero or make data executable: exploit aids.
	{name: "personality", nr: unix.SYS_PERSONALITY, ret: retEPERM, arg: 0,
		noneOf: []uint32{0, perLinux32, uname26, uname26 | perLinux32, perQuery}},

	// Programs loaded into the kernel and the kernel's performance counters.
	deny("bpf", unix.SYS_BPF, retEPERM),
	deny("perf_event_open", unix.SYS_PERF_EVENT_OPEN, retEPERM),
	// A common primitive for winning kernel races in exploits (docker blocks it too).
	deny("userfaultfd", unix.SYS_USERFAULTFD, retEPERM),

	// The session keyring inherited from the daemon holds its keys; key types have a history of kernel bugs.
	deny("keyctl", unix.SYS_KEYCTL, retEPERM),
	deny("add_key", unix.SYS_ADD_KEY, retEPERM),
	deny("request_key", unix.SYS_REQUEST_KEY, retEPERM),

	// A new user namespace grants every capability inside it: the start of the pivot_root escape from read-only binds.
	{name: "unshare", nr: unix.SYS_UNSHARE, ret: retEPERM, arg: 0, anyBits: unix.CLONE_NEWUSER, nested: true},
	// clone's flags are arg 0 on x86_64; the kernel uses their low 32 bits only.
	{name: "clone", nr: unix.SYS_CLONE, ret: retEPERM, arg: 0, anyBits: unix.CLONE_NEWUSER, nested: true},
	// clone3 keeps its flags in memory the filter cannot read; ENOSYS makes callers fall back to clone.
	{name: "clone3", nr: unix.SYS_CLONE3, ret: retENOSYS, nested: true},
	// Joining another namespace by fd, including a user namespace made outside.
	{name: "setns", nr: unix.SYS_SETNS, ret: retEPERM, nested: true},

	// Mounts could hide or replace the sandbox's read-only binds.
	{name: "mount", nr: unix.SYS_MOUNT, ret: retEPERM, nested: true},
	{name: "umount2", nr: unix.SYS_UMOUNT2, ret: retEPERM, nested: true},
	{name: "pivot_root", nr: unix.SYS_PIVOT_ROOT, ret: retEPERM, nested: true},
	// The new mount API does what mount(2) does, by fd.
	{name: "open_tree", nr: unix.SYS_OPEN_TREE, ret: retEPERM, nested: true},
	{name: "move_mount", nr: unix.SYS_MOVE_MOUNT, ret: retEPERM, nested: true},
	{name: "fsopen", nr: unix.SYS_FSOPEN, ret: retEPERM, nested: true},
	{name: "fsconfig", nr: unix.SYS_FSCONFIG, ret: retEPERM, nested: true},
	{name: "fsmount", nr: unix.SYS_FSMOUNT, ret: retEPERM, nested: true},
	{name: "fspick", nr: unix.SYS_FSPICK, ret: retEPERM, nested: true},
	{name: "mount_setattr", nr: unix.SYS_MOUNT_SETATTR, ret: retEPERM, nested: true},
	// open_tree with mount attributes (Linux 6.15).
	{name: "open_tree_attr", nr: unix.SYS_OPEN_TREE_ATTR, ret: retEPERM, nested: true},

	// Replacing the running kernel or loading code into it.
	deny("kexec_load", unix.SYS_KEXEC_LOAD, retEPERM),
	deny("kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, retEPERM),
	deny("init_module", unix.SYS_INIT_MODULE, retEPERM),
	deny("finit_module", unix.SYS_FINIT_MODULE, retEPERM),
	deny("delete_module", unix.SYS_DELETE_MODULE, retEPERM),
	// The module calls of Linux 2.4, gone from today's kernels: refused should one ever answer.
	deny("create_module", unix.SYS_CREATE_MODULE, retEPERM),
	deny("get_kernel_syms", unix.SYS_GET_KERNEL_SYMS, retEPERM),
	deny("query_module", unix.SYS_QUERY_MODULE, retEPERM),

	// The host's settings, each behind a capability the sandbox lacks: refused before the kernel's own check.
	deny("reboot", unix.SYS_REBOOT, retEPERM), // in a PID namespace it kills the namespace's init
	deny("swapon", unix.SYS_SWAPON, retEPERM),
	deny("swapoff", unix.SYS_SWAPOFF, retEPERM),
	deny("acct", unix.SYS_ACCT, retEPERM),
	deny("quotactl", unix.SYS_QUOTACTL, retEPERM),
	deny("quotactl_fd", unix.SYS_QUOTACTL_FD, retEPERM),
	deny("vhangup", unix.SYS_VHANGUP, retEPERM),
	deny("lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE, retEPERM),
	deny("nfsservctl", unix.SYS_NFSSERVCTL, retEPERM),
	// The host's clocks: one process setting them moves every other's.
	deny("settimeofday", unix.SYS_SETTIMEOFDAY, retEPERM),
	deny("clock_settime", unix.SYS_CLOCK_SETTIME, retEPERM),
	deny("adjtimex", unix.SYS_ADJTIMEX, retEPERM),
	deny("clock_adjtime", unix.SYS_CLOCK_ADJTIME, retEPERM),
	// The kernel's log holds kernel addresses and the host's messages.
	deny("syslog", unix.SYS_SYSLOG, retEPERM),
	// Raw I/O ports reach the host's hardware.
	deny("iopl", unix.SYS_IOPL, retEPERM),
	deny("ioperm", unix.SYS_IOPERM, retEPERM),
	// Obsolete interfaces nothing current uses, kept alive in kernels with a history of bugs.
	deny("uselib", unix.SYS_USELIB, retEPERM),
	deny("sysfs", unix.SYS_SYSFS, retEPERM),
	deny("_sysctl", unix.SYS__SYSCTL, retEPERM),
	deny("ustat", unix.SYS_USTAT, retEPERM),
}

// Program returns the filter for o as classic BPF instructions, in the order
// the kernel runs them: the architecture check, the x32 check, one block per
// refused syscall, then allow.
func Program(o Options) ([]unix.SockFilter, error) {
	p := []unix.SockFilter{
		// Any other architecture (i386 through int 0x80, for one) numbers
		// syscalls differently: kill it rather than misread it.
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch),
		jump(unix.BPF_JEQ, unix.AUDIT_ARCH_X86_64, 1, 0),
		stmt(unix.BPF_RET|unix.BPF_K, retKill),
		// x32 calls carry the x86_64 token and a number with bit 30 set; no
		// x86_64 syscall number is that large, so kill everything from there up.
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr),
		jump(unix.BPF_JGE, x32SyscallBit, 0, 1),
		stmt(unix.BPF_RET|unix.BPF_K, retKill),
	}
	seen := make(map[uint32]bool)
	for _, r := range policy {
		if seen[r.nr] {
			return nil, fmt.Errorf("seccomp filter: syscall %s (%d) listed twice", r.name, r.nr)
		}
		seen[r.nr] = true
		if r.nested && o.NestedSandbox {
			continue
		}
		if o.NestedSandbox && len(r.nestedLifts) > 0 {
			r.anyOf = without(r.anyOf, r.nestedLifts)
		}
		b, err := r.block()
		if err != nil {
			return nil, err
		}
		p = append(p, b...)
	}
	p = append(p, stmt(unix.BPF_RET|unix.BPF_K, retAllow))
	if len(p) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp filter: %d instructions, more than the kernel's %d", len(p), unix.BPF_MAXINSNS)
	}
	return p, nil
}

// block returns r's instructions. They expect the syscall number in A and
// either fall through with A unchanged (another syscall) or return.
func (r rule) block() ([]unix.SockFilter, error) {
	var body []unix.SockFilter
	kinds := 0
	for _, set := range []bool{len(r.anyOf) > 0, r.anyBits != 0, len(r.noneOf) > 0} {
		if set {
			kinds++
		}
	}
	switch {
	case kinds > 1:
		return nil, fmt.Errorf("seccomp filter: rule %s has more than one of a value list, a bit mask and an exception list", r.name)
	case len(r.noneOf) > 0:
		// ld arg; jeq v0 → ret allow; ...; ret r.ret; ret allow
		n := len(r.noneOf)
		if n > 250 {
			return nil, fmt.Errorf("seccomp filter: rule %s compares %d values", r.name, n)
		}
		body = append(body, r.loadArg())
		for i, v := range r.noneOf {
			body = append(body, jump(unix.BPF_JEQ, v, uint8(n-i), 0))
		}
		body = append(body, stmt(unix.BPF_RET|unix.BPF_K, r.ret), stmt(unix.BPF_RET|unix.BPF_K, retAllow))
	case len(r.anyOf) > 0:
		// ld arg; jeq v0 → ret r.ret; ...; ret allow; ret r.ret
		n := len(r.anyOf)
		if n > 250 {
			return nil, fmt.Errorf("seccomp filter: rule %s compares %d values", r.name, n)
		}
		body = append(body, r.loadArg())
		for i, v := range r.anyOf {
			body = append(body, jump(unix.BPF_JEQ, v, uint8(n-i), 0))
		}
		body = append(body, stmt(unix.BPF_RET|unix.BPF_K, retAllow), stmt(unix.BPF_RET|unix.BPF_K, r.ret))
	case r.anyBits != 0:
		// ld arg; jset bits → ret r.ret; ret allow; ret r.ret
		body = append(body,
			r.loadArg(),
			jump(unix.BPF_JSET, r.anyBits, 1, 0),
			stmt(unix.BPF_RET|unix.BPF_K, retAllow),
			stmt(unix.BPF_RET|unix.BPF_K, r.ret))
	default:
		body = append(body, stmt(unix.BPF_RET|unix.BPF_K, r.ret))
	}
	if r.arg < 0 || r.arg > 5 {
		return nil, fmt.Errorf("seccomp filter: rule %s reads argument %d", r.name, r.arg)
	}
	// Skip the body when the number differs.
	return append([]unix.SockFilter{jump(unix.BPF_JEQ, r.nr, 0, uint8(len(body)))}, body...), nil
}

// loadArg loads the low 32 bits of the rule's argument into A.
func (r rule) loadArg() unix.SockFilter {
	return stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, uint32(offArgs+8*r.arg))
}

func stmt(code uint16, k uint32) unix.SockFilter {
	return unix.SockFilter{Code: code, K: k}
}

// jump compares A with k (op is BPF_JEQ, BPF_JGE or BPF_JSET) and skips jt
// instructions when true, jf when false.
func jump(op uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: unix.BPF_JMP | op | unix.BPF_K, Jt: jt, Jf: jf, K: k}
}

// without returns values minus drop, in order.
func without(values, drop []uint32) []uint32 {
	var out []uint32
	for _, v := range values {
		keep := true
		for _, d := range drop {
			keep = keep && v != d
		}
		if keep {
			out = append(out, v)
		}
	}
	return out
}
