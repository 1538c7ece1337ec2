package cgroupfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/mountinfo"
)

// EnterThread moves the calling OS thread, and only it, into the cgroup in
// every hierarchy, and returns the function that moves it back to where it
// was. The caller keeps the thread locked (runtime.LockOSThread) while it is
// inside; a process it forks then is born in the cgroup, and never runs
// outside it.
//
// Why not start the process and move it (Add): moving a process takes the
// kernel's global cgroup_threadgroup_rwsem for writing, and the first writer
// after a quiet moment waits an RCU grace period, 5-15 ms on this kind of
// machine; a thread that moves itself takes no such lock (~0.2 ms for three
// hierarchies). A thread cannot move alone into a cgroup v2 domain: there,
// and wherever the thread's own place cannot be found, EnterThread moves
// nothing and fails, and the caller moves the process after it starts.
func (c Cgroup) EnterThread() (leave func() error, err error) {
	homes, err := threadHomes(c.Dirs)
	if err != nil {
		return nil, err
	}
	back := func(n int) error {
		var errs []error
		for _, h := range homes[:n] {
			if err := WriteFile(filepath.Join(h, "tasks"), "0"); err != nil {
				errs = append(errs, fmt.Errorf("move thread back to cgroup %s: %w", h, err))
			}
		}
		return errors.Join(errs...)
	}
	for i, d := range c.Dirs {
		if err := WriteFile(filepath.Join(d, "tasks"), "0"); err != nil {
			return nil, errors.Join(fmt.Errorf("move thread into cgroup %s: %w", d, err), back(i))
		}
	}
	return func() error { return back(len(homes)) }, nil
}

// threadHomes returns the calling thread's cgroup directory in the
// hierarchy of each of dirs, which must all be cgroup v1 hierarchies.
func threadHomes(dirs []string) ([]string, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read own cgroups: %w", err)
	}
	var homes []string
	for _, d := range dirs {
		m, ok := mountOf(mounts, d)
		if !ok {
			return nil, fmt.Errorf("cgroup %s: not in a mounted cgroup hierarchy", d)
		}
		if m.v2 {
			return nil, fmt.Errorf("cgroup %s: a thread cannot move alone into a cgroup v2 domain", d)
		}
		home, ok := m.home(string(data))
		if !ok {
			return nil, fmt.Errorf("cgroup %s: this thread's place in its hierarchy (mounted at %s) is not visible", d, m.point)
		}
		homes = append(homes, home)
	}
	return homes, nil
}

// cgroupMount is a mounted cgroup hierarchy: where it is mounted, the
// cgroup at its root, and for v1 its controllers and name ("name=systemd").
type cgroupMount struct {
	point, root string
	v2          bool
	options     map[string]bool
}

// cgroupMounts lists the cgroup mounts of this mount namespace.
func cgroupMounts() ([]cgroupMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var out []cgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory"
		left, right, ok := strings.Cut(sc.Text(), " - ")
		lf, rf := strings.Fields(left), strings.Fields(right)
		if !ok || len(lf) < 5 || len(rf) < 3 || (rf[0] != "cgroup" && rf[0] != "cgroup2") {
			continue
		}
		m := cgroupMount{point: mountinfo.Unescape(lf[4]), root: mountinfo.Unescape(lf[3]), v2: rf[0] == "cgroup2", options: map[string]bool{}}
		for _, o := range strings.Split(rf[2], ",") {
			m.options[o] = true
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// mountOf returns the mount whose hierarchy holds dir: the deepest mount
// point above it. A directory above a hierarchy's mount point (on the tmpfs
// of /sys/fs/cgroup, say) is in none.
func mountOf(mounts []cgroupMount, dir string) (cgroupMount, bool) {
	var best cgroupMount
	found := false
	for _, m := range mounts {
		if (dir == m.point || strings.HasPrefix(dir, m.point+"/")) && len(m.point) >= len(best.point) {
			best, found = m, true
		}
	}
	return best, found
}

// home finds the hierarchy's line in a /proc/<pid>/cgroup listing
// ("4:memory:/a/b"; "0::/a/b" for v2) and returns that cgroup's directory
// under the mount point.
func (m cgroupMount) home(procCgroup string) (string, bool) {
	for _, line := range strings.Split(procCgroup, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (parts[1] == "") != m.v2 {
			continue
		}
		if !m.v2 && !m.hasAll(strings.Split(parts[1], ",")) {
			continue
		}
		rel, ok := strings.CutPrefix(parts[2], m.root)
		if !ok || (rel != "" && m.root != "/" && !strings.HasPrefix(rel, "/")) {
			return "", false
		}
		return filepath.Join(m.point, rel), true
	}
	return "", false
}

func (m cgroupMount) hasAll(controllers []string) bool {
	for _, c := range controllers {
		if !m.options[c] {
			return false
		}
	}
	return true
}

// WriteFile writes v to an existing cgroup file: it is never created, so
// a file a missing controller would have had fails the write.
func WriteFile(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// OpenV2 opens the cgroup's directory for CLONE_INTO_CGROUP (Go's
// SysProcAttr.UseCgroupFD) when the cgroup is one cgroup v2 directory, as
// on a v2-only host: a process forked with it is born in the cgroup, with
// no move and so no global lock. It fails for a v1 cgroup (there, see
// EnterThread).
func (c Cgroup) OpenV2() (*os.File, error) {
	if len(c.Dirs) != 1 {
		return nil, fmt.Errorf("cgroup %v: %d hierarchies, not one cgroup v2 directory", c.Dirs, len(c.Dirs))
	}
	f, err := os.Open(c.Dirs[0])
	if err != nil {
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		f.Close()
		return nil, fmt.Errorf("cgroup %s: not a cgroup v2 directory (%v)", c.Dirs[0], err)
	}
	return f, nil
}
