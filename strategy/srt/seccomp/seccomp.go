// Package seccomp builds and installs the seccomp filter that the srt sandbox
// applies to an agent's runtime just before exec.
//
// The filter allows by default and refuses a list of kernel interfaces a
// runtime has no business with (unix, netlink and vsock sockets, io_uring,
// ptrace and everything else that reaches into another process, bpf, keys,
// kexec and modules, new user namespaces, mounts, file handles, the host's
// clocks, swap, accounting, quotas and kernel log, raw I/O ports, NUMA
// placement, unusual personas and obsolete calls): the calls docker's default
// profile refuses to a process without capabilities. It is built only for
// linux/amd64; elsewhere Install fails so the sandbox fails closed.
package seccomp

// Options selects the policy.
type Options struct {
	// NestedSandbox allows what a runtime's own bwrap sandbox needs inside
	// ours: new user namespaces (unshare and clone with CLONE_NEWUSER, clone3,
	// setns) and the mount family (mount, umount2, pivot_root and the new
	// mount API). Off by default.
	NestedSandbox bool
}
