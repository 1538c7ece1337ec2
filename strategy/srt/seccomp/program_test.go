//go:build linux && amd64

package seccomp

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// These tests run the generated program in a small classic-BPF interpreter,
// so every rule is checked against the exact bytes the kernel would see,
// including architectures and argument values no live call can produce.

const (
	allow  = unix.SECCOMP_RET_ALLOW
	kill   = unix.SECCOMP_RET_KILL_PROCESS
	eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// seccompData lays out struct seccomp_data as the kernel does on amd64.
func seccompData(arch, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], nr)
	binary.LittleEndian.PutUint32(b[4:], arch)
	binary.LittleEndian.PutUint64(b[8:], 0x401000) // instruction pointer
	for i, a := range args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// run interprets the instructions seccomp filters use here (ld word abs,
// jeq/jge/jset with a constant, ret constant) and fails on anything else,
// on a jump out of the program, or on falling off its end.
func run(prog []unix.SockFilter, data []byte) (uint32, error) {
	var a uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if in.K%4 != 0 || int(in.K)+4 > len(data) {
				return 0, fmt.Errorf("pc %d: load at offset %d", pc, in.K)
			}
			a = binary.LittleEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			var cond bool
			switch in.Code &^ (unix.BPF_JMP | unix.BPF_K) {
			case unix.BPF_JEQ:
				cond = a == in.K
			case unix.BPF_JGE:
				cond = a >= in.K
			case unix.BPF_JSET:
				cond = a&in.K != 0
			}
			off := int(in.Jf)
			if cond {
				off = int(in.Jt)
			}
			if pc+1+off >= len(prog) {
				return 0, fmt.Errorf("pc %d: jump past the end", pc)
			}
			pc += off
		case unix.BPF_RET | unix.BPF_K:
			return in.K, nil
		default:
			return 0, fmt.Errorf("pc %d: unexpected opcode %#x", pc, in.Code)
		}
	}
	return 0, fmt.Errorf("fell off the end of the program")
}

func mustProgram(t *testing.T, o Options) []unix.SockFilter {
	t.Helper()
	p, err := Program(o)
	if err != nil {
		t.Fatalf("Program(%+v): %v", o, err)
	}
	return p
}

func TestProgramPolicy(t *testing.T) {
	const x64 = unix.AUDIT_ARCH_X86_64
	gothread := uint64(unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD)
	tests := []struct {
		name         string
		arch, nr     uint32
		args         []uint64
		want, nested uint32
	}{
		{"i386 getpid", unix.AUDIT_ARCH_I386, 20, nil, kill, kill},
		{"i386 with an x86_64 allowed number", unix.AUDIT_ARCH_I386, unix.SYS_GETPID, nil, kill, kill},
		{"aarch64", unix.AUDIT_ARCH_AARCH64, 0, nil, kill, kill},
		{"arch zero", 0, unix.SYS_GETPID, nil, kill, kill},
		{"getpid", x64, unix.SYS_GETPID, nil, allow, allow},
		{"read", x64, unix.SYS_READ, nil, allow, allow},
		{"x32 getpid", x64, x32SyscallBit | unix.SYS_GETPID, nil, kill, kill},
		{"x32 socket AF_UNIX", x64, x32SyscallBit | unix.SYS_SOCKET, []uint64{unix.AF_UNIX}, kill, kill},
		{"syscall -1", x64, 0xffffffff, nil, kill, kill},
		{"highest number below the x32 bit", x64, x32SyscallBit - 1, nil, allow, allow},

		{"socket AF_UNIX", x64, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, allow, allow},
		{"socket AF_UNIX with high bits", x64, unix.SYS_SOCKET, []uint64{unix.AF_UNIX | 1<<32, unix.SOCK_STREAM | unix.SOCK_CLOEXEC}, allow, allow},
		{"socket AF_UNIX all high bits", x64, unix.SYS_SOCKET, []uint64{0xffffffff_00000001}, allow, allow},
		{"socket AF_NETLINK", x64, unix.SYS_SOCKET, []uint64{unix.AF_NETLINK, unix.SOCK_RAW}, eperm, allow},
		{"socket AF_VSOCK", x64, unix.SYS_SOCKET, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, eperm, eperm},
		{"socket AF_INET", x64, unix.SYS_SOCKET, []uint64{unix.AF_INET, unix.SOCK_STREAM}, allow, allow},
		{"socket AF_INET6", x64, unix.SYS_SOCKET, []uint64{unix.AF_INET6, unix.SOCK_DGRAM}, allow, allow},
		{"socket AF_INET with high bits", x64, unix.SYS_SOCKET, []uint64{unix.AF_INET | 1<<32}, allow, allow},
		{"socket AF_INET, type 1 (the unix value in arg 1)", x64, unix.SYS_SOCKET, []uint64{unix.AF_INET, 1}, allow, allow},
		{"socketpair AF_UNIX", x64, unix.SYS_SOCKETPAIR, []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, allow, allow},

		{"io_uring_setup", x64, unix.SYS_IO_URING_SETUP, nil, eperm, eperm},
		{"io_uring_enter", x64, unix.SYS_IO_URING_ENTER, nil, eperm, eperm},
		{"io_uring_register", x64, unix.SYS_IO_URING_REGISTER, nil, eperm, eperm},
		{"ptrace", x64, unix.SYS_PTRACE, nil, eperm, eperm},
		{"process_vm_readv", x64, unix.SYS_PROCESS_VM_READV, nil, eperm, eperm},
		{"process_vm_writev", x64, unix.SYS_PROCESS_VM_WRITEV, nil, eperm, eperm},
		{"bpf", x64, unix.SYS_BPF, nil, eperm, eperm},
		{"perf_event_open", x64, unix.SYS_PERF_EVENT_OPEN, nil, eperm, eperm},
		{"userfaultfd", x64, unix.SYS_USERFAULTFD, nil, eperm, eperm},
		{"keyctl", x64, unix.SYS_KEYCTL, nil, eperm, eperm},
		{"add_key", x64, unix.SYS_ADD_KEY, nil, eperm, eperm},
		{"request_key", x64, unix.SYS_REQUEST_KEY, nil, eperm, eperm},
		{"kexec_load", x64, unix.SYS_KEXEC_LOAD, nil, eperm, eperm},
		{"kexec_file_load", x64, unix.SYS_KEXEC_FILE_LOAD, nil, eperm, eperm},
		{"init_module", x64, unix.SYS_INIT_MODULE, nil, eperm, eperm},
		{"finit_module", x64, unix.SYS_FINIT_MODULE, nil, eperm, eperm},
		{"delete_module", x64, unix.SYS_DELETE_MODULE, nil, eperm, eperm},

		{"pidfd_getfd", x64, unix.SYS_PIDFD_GETFD, nil, eperm, eperm},
		{"kcmp", x64, unix.SYS_KCMP, nil, eperm, eperm},
		{"process_madvise", x64, unix.SYS_PROCESS_MADVISE, nil, eperm, eperm},
		{"migrate_pages", x64, unix.SYS_MIGRATE_PAGES, nil, eperm, eperm},
		{"move_pages", x64, unix.SYS_MOVE_PAGES, nil, eperm, eperm},
		{"mbind", x64, unix.SYS_MBIND, nil, eperm, eperm},
		{"set_mempolicy", x64, unix.SYS_SET_MEMPOLICY, nil, eperm, eperm},
		{"set_mempolicy_home_node", x64, unix.SYS_SET_MEMPOLICY_HOME_NODE, nil, eperm, eperm},
		{"get_mempolicy stays allowed", x64, unix.SYS_GET_MEMPOLICY, nil, allow, allow},
		{"open_by_handle_at", x64, unix.SYS_OPEN_BY_HANDLE_AT, nil, eperm, eperm},
		{"name_to_handle_at", x64, unix.SYS_NAME_TO_HANDLE_AT, nil, eperm, eperm},
		{"fanotify_init", x64, unix.SYS_FANOTIFY_INIT, nil, eperm, eperm},
		{"fanotify_mark stays allowed (no fd to mark without init)", x64, unix.SYS_FANOTIFY_MARK, nil, allow, allow},
		{"inotify_init1 stays allowed", x64, unix.SYS_INOTIFY_INIT1, nil, allow, allow},
		{"personality PER_LINUX", x64, unix.SYS_PERSONALITY, []uint64{0}, allow, allow},
		{"personality PER_LINUX32", x64, unix.SYS_PERSONALITY, []uint64{0x0008}, allow, allow},
		{"personality UNAME26", x64, unix.SYS_PERSONALITY, []uint64{0x0020000}, allow, allow},
		{"personality UNAME26|PER_LINUX32", x64, unix.SYS_PERSONALITY, []uint64{0x0020008}, allow, allow},
		{"personality query", x64, unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow, allow},
		{"personality query, high bits (the kernel reads an unsigned int)", x64, unix.SYS_PERSONALITY, []uint64{0xffffffff_ffffffff}, allow, allow},
		{"personality ADDR_NO_RANDOMIZE", x64, unix.SYS_PERSONALITY, []uint64{0x0040000}, eperm, eperm},
		{"personality MMAP_PAGE_ZERO", x64, unix.SYS_PERSONALITY, []uint64{0x0100000}, eperm, eperm},
		{"personality READ_IMPLIES_EXEC", x64, unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm, eperm},
		{"personality PER_LINUX|ADDR_NO_RANDOMIZE with PER_LINUX in the high bits", x64, unix.SYS_PERSONALITY, []uint64{1<<32 | 0x0040000}, eperm, eperm},
		{"personality PER_SVR4", x64, unix.SYS_PERSONALITY, []uint64{0x0001 | 0x0100000 | 0x4000000}, eperm, eperm},
		{"create_module", x64, unix.SYS_CREATE_MODULE, nil, eperm, eperm},
		{"get_kernel_syms", x64, unix.SYS_GET_KERNEL_SYMS, nil, eperm, eperm},
		{"query_module", x64, unix.SYS_QUERY_MODULE, nil, eperm, eperm},
		{"reboot", x64, unix.SYS_REBOOT, nil, eperm, eperm},
		{"swapon", x64, unix.SYS_SWAPON, nil, eperm, eperm},
		{"swapoff", x64, unix.SYS_SWAPOFF, nil, eperm, eperm},
		{"acct", x64, unix.SYS_ACCT, nil, eperm, eperm},
		{"quotactl", x64, unix.SYS_QUOTACTL, nil, eperm, eperm},
		{"quotactl_fd", x64, unix.SYS_QUOTACTL_FD, nil, eperm, eperm},
		{"vhangup", x64, unix.SYS_VHANGUP, nil, eperm, eperm},
		{"lookup_dcookie", x64, unix.SYS_LOOKUP_DCOOKIE, nil, eperm, eperm},
		{"nfsservctl", x64, unix.SYS_NFSSERVCTL, nil, eperm, eperm},
		{"settimeofday", x64, unix.SYS_SETTIMEOFDAY, nil, eperm, eperm},
		{"clock_settime", x64, unix.SYS_CLOCK_SETTIME, nil, eperm, eperm},
		{"adjtimex", x64, unix.SYS_ADJTIMEX, nil, eperm, eperm},
		{"clock_adjtime", x64, unix.SYS_CLOCK_ADJTIME, nil, eperm, eperm},
		{"clock_gettime stays allowed", x64, unix.SYS_CLOCK_GETTIME, nil, allow, allow},
		{"gettimeofday stays allowed", x64, unix.SYS_GETTIMEOFDAY, nil, allow, allow},
		{"syslog", x64, unix.SYS_SYSLOG, nil, eperm, eperm},
		{"iopl", x64, unix.SYS_IOPL, nil, eperm, eperm},
		{"ioperm", x64, unix.SYS_IOPERM, nil, eperm, eperm},
		{"uselib", x64, unix.SYS_USELIB, nil, eperm, eperm},
		{"sysfs", x64, unix.SYS_SYSFS, nil, eperm, eperm},
		{"_sysctl", x64, unix.SYS__SYSCTL, nil, eperm, eperm},
		{"ustat", x64, unix.SYS_USTAT, nil, eperm, eperm},
		{"pidfd_open stays allowed", x64, unix.SYS_PIDFD_OPEN, nil, allow, allow},
		{"pidfd_send_signal stays allowed", x64, unix.SYS_PIDFD_SEND_SIGNAL, nil, allow, allow},

		{"unshare CLONE_NEWUSER", x64, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, eperm, allow},
		{"unshare CLONE_NEWUSER|CLONE_NEWNS", x64, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER | unix.CLONE_NEWNS}, eperm, allow},
		{"unshare CLONE_NEWNS", x64, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWNS}, allow, allow},
		{"unshare CLONE_FILES", x64, unix.SYS_UNSHARE, []uint64{unix.CLONE_FILES}, allow, allow},
		{"clone CLONE_NEWUSER", x64, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, eperm, allow},
		{"clone CLONE_NEWUSER with high bits", x64, unix.SYS_CLONE, []uint64{1<<40 | unix.CLONE_NEWUSER}, eperm, allow},
		{"clone of a Go thread", x64, unix.SYS_CLONE, []uint64{gothread}, allow, allow},
		{"clone for fork+exec", x64, unix.SYS_CLONE, []uint64{unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)}, allow, allow},
		{"clone, CLONE_NEWUSER bit in the stack argument", x64, unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD), unix.CLONE_NEWUSER}, allow, allow},
		{"clone3", x64, unix.SYS_CLONE3, nil, enosys, allow},
		{"setns", x64, unix.SYS_SETNS, []uint64{3, 0}, eperm, allow},

		{"mount", x64, unix.SYS_MOUNT, nil, eperm, allow},
		{"umount2", x64, unix.SYS_UMOUNT2, nil, eperm, allow},
		{"pivot_root", x64, unix.SYS_PIVOT_ROOT, nil, eperm, allow},
		{"open_tree", x64, unix.SYS_OPEN_TREE, nil, eperm, allow},
		{"open_tree_attr", x64, unix.SYS_OPEN_TREE_ATTR, nil, eperm, allow},
		{"move_mount", x64, unix.SYS_MOVE_MOUNT, nil, eperm, allow},
		{"fsopen", x64, unix.SYS_FSOPEN, nil, eperm, allow},
		{"fsconfig", x64, unix.SYS_FSCONFIG, nil, eperm, allow},
		{"fsmount", x64, unix.SYS_FSMOUNT, nil, eperm, allow},
		{"fspick", x64, unix.SYS_FSPICK, nil, eperm, allow},
		{"mount_setattr", x64, unix.SYS_MOUNT_SETATTR, nil, eperm, allow},
		{"listmount stays allowed", x64, unix.SYS_LISTMOUNT, nil, allow, allow},
		{"chroot stays allowed", x64, unix.SYS_CHROOT, nil, allow, allow},
	}
	def := mustProgram(t, Options{})
	nested := mustProgram(t, Options{NestedSandbox: true})
	for _, tt := range tests {
		data := seccompData(tt.arch, tt.nr, tt.args...)
		for _, c := range []struct {
			mode string
			prog []unix.SockFilter
			want uint32
		}{{"default", def, tt.want}, {"nested", nested, tt.nested}} {
			got, err := run(c.prog, data)
			if err != nil {
				t.Errorf("%s (%s): %v", tt.name, c.mode, err)
				continue
			}
			if got != c.want {
				t.Errorf("%s (%s) = %#x, want %#x", tt.name, c.mode, got, c.want)
			}
		}
	}
}

// TestProgramChecksArchFirst pins the head of the program: nothing may read
// the syscall number before the architecture is known to be x86_64.
func TestProgramChecksArchFirst(t *testing.T) {
	want := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, Jf: 0, K: unix.AUDIT_ARCH_X86_64},
		{Code: unix.BPF_RET | unix.BPF_K, K: kill},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, Jt: 0, Jf: 1, K: 0x40000000},
		{Code: unix.BPF_RET | unix.BPF_K, K: kill},
	}
	for _, o := range []Options{{}, {NestedSandbox: true}} {
		p := mustProgram(t, o)
		if len(p) < len(want) {
			t.Fatalf("Program(%+v) has %d instructions", o, len(p))
		}
		if got := p[:len(want)]; !reflect.DeepEqual(got, want) {
			t.Errorf("Program(%+v) starts with %+v, want %+v", o, got, want)
		}
		if last := p[len(p)-1]; last != (unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: allow}) {
			t.Errorf("Program(%+v) ends with %+v, want ret allow", o, last)
		}
	}
}

func TestProgramIsStable(t *testing.T) {
	for _, o := range []Options{{}, {NestedSandbox: true}} {
		a, b := mustProgram(t, o), mustProgram(t, o)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("Program(%+v) differs between calls:\n%+v\n%+v", o, a, b)
		}
		if len(a) > unix.BPF_MAXINSNS {
			t.Errorf("Program(%+v) has %d instructions, the kernel takes %d", o, len(a), unix.BPF_MAXINSNS)
		}
		t.Logf("Program(%+v): %d instructions", o, len(a))
	}
	if reflect.DeepEqual(mustProgram(t, Options{}), mustProgram(t, Options{NestedSandbox: true})) {
		t.Error("NestedSandbox does not change the program")
	}
}
