package cgroupfs

import "testing"

// Where a thread is in each hierarchy, from /proc/thread-self/cgroup and
// the mounts: controllers mounted together, a named hierarchy, a mount of
// a cgroup namespace's root, and v2.
func TestThreadHome(t *testing.T) {
	mounts := []cgroupMount{
		{point: "/sys/fs/cgroup/cpu,cpuacct", root: "/", options: opts("rw", "cpu", "cpuacct")},
		{point: "/sys/fs/cgroup/memory", root: "/", options: opts("rw", "memory")},
		{point: "/sys/fs/cgroup/systemd", root: "/", options: opts("rw", "xattr", "name=systemd")},
		{point: "/ns/pids", root: "/outer", options: opts("rw", "pids")},
		{point: "/sys/fs/cgroup/unified", root: "/", v2: true, options: opts("rw", "nsdelegate")},
	}
	proc := "12:pids:/outer/shims\n4:memory:/daemon\n3:cpu,cpuacct:/\n1:name=systemd:/system.slice/x.service\n0::/daemon.slice\n"
	for _, c := range []struct{ dir, home string }{
		{"/sys/fs/cgroup/cpu,cpuacct/agentconnect/s1", "/sys/fs/cgroup/cpu,cpuacct"},
		{"/sys/fs/cgroup/memory/agentconnect/s1", "/sys/fs/cgroup/memory/daemon"},
		{"/sys/fs/cgroup/systemd/agentconnect/s1", "/sys/fs/cgroup/systemd/system.slice/x.service"},
		{"/ns/pids/agentconnect/s1", "/ns/pids/shims"},
		{"/sys/fs/cgroup/unified/agentconnect/s1", "/sys/fs/cgroup/unified/daemon.slice"},
	} {
		m, ok := mountOf(mounts, c.dir)
		if !ok {
			t.Errorf("%s: no mount found", c.dir)
			continue
		}
		if got, ok := m.home(proc); !ok || got != c.home {
			t.Errorf("%s: home = %q, %v; want %q", c.dir, got, ok, c.home)
		}
	}
	// Not under a hierarchy, a prefix that is not a parent directory, a
	// thread outside the mount's root.
	if _, ok := mountOf(mounts, "/sys/fs/cgroup/memory2/x"); ok {
		t.Error("/sys/fs/cgroup/memory2/x: found in the memory hierarchy")
	}
	m, _ := mountOf(mounts, "/ns/pids/x")
	if got, ok := m.home("12:pids:/outerly\n"); ok {
		t.Errorf("a thread in /outerly is at %q under a mount of /outer", got)
	}
	if got, ok := m.home("12:pids:/\n"); ok {
		t.Errorf("a thread in / is at %q under a mount of /outer", got)
	}
}

func opts(o ...string) map[string]bool {
	m := map[string]bool{}
	for _, s := range o {
		m[s] = true
	}
	return m
}
