// Package limits creates each session's cgroup with its limits (pids, memory,
// cpu) on cgroup v1, hybrid and v2 hosts, and tells when it cannot.
package limits

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
)

// DefaultPids is the pids limit of a session whose agent sets none: enough
// for a Node runtime and its tools, few enough to stop a fork bomb.
const DefaultPids = 4096

const cpuPeriod = 100000 // µs, the kernel's default

// Support says whether sessions get cgroups on this daemon.
type Support struct {
	Available bool
	Mode      string // "v1", "hybrid" or "v2"
	Reason    string // why not, when unavailable
}

// Manager creates session cgroups under one parent, named after the daemon's
// home so that two daemons on one machine never share one.
type Manager struct {
	mode   mode
	parent string // below the daemon's own cgroup (v1), or a v2 group path
	// parentDirs are the parent's directories, one per hierarchy, and
	// levels how many of their path's last levels Setup's name made.
	parentDirs []string
	levels     int
	// v1Parents is the parent's directory in each v1 controller a session
	// joins, found once by Setup: a session goes under the parent wherever
	// the daemon is moved since.
	v1Parents map[string]string
	// v2Root is the unified hierarchy's mount (cgroupRoot on a v2 host).
	v2Root string
}

// cgroupRoot is where the hierarchies are mounted: the unified one on a v2
// host, each v1 controller's in a directory of its name on the others.
const cgroupRoot = "/sys/fs/cgroup"

// mode is how the host mounts cgroups.
type mode int

const (
	unavailable mode = iota
	legacy           // v1 only
	hybrid           // v1 controllers, and a v2 hierarchy without them
	unified          // v2 only
)

// hostMode tells the host's cgroup mode from the filesystems mounted.
func hostMode() mode {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupRoot, &st); err != nil {
		return unavailable
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return unified
	}
	if unix.Statfs(filepath.Join(cgroupRoot, "unified"), &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return hybrid
	}
	return legacy
}

// Setup checks that this process can create cgroups by creating and removing
// one, and returns a Manager when it can. On a cgroup v2 host where the
// daemon's own cgroup is delegated to it (systemd Delegate=yes), the daemon
// moves itself into a leaf "supervisor" child first: v2 lets a cgroup either
// hold processes or give controllers to children, not both.
func Setup(name string) (*Manager, Support) {
	mode := hostMode()
	m := &Manager{mode: mode, levels: strings.Count(filepath.Clean(name), "/") + 1, v2Root: cgroupRoot}
	var sup Support
	switch mode {
	case legacy:
		sup.Mode = "v1"
	case hybrid:
		sup.Mode = "hybrid"
	case unified:
		sup.Mode = "v2"
	default:
		sup.Reason = "no cgroup filesystem is mounted at /sys/fs/cgroup"
		return nil, sup
	}
	if mode == unified {
		own, err := ownV2Group()
		if err != nil {
			sup.Reason = err.Error()
			return nil, sup
		}
		base := own
		if filepath.Base(own) == "supervisor" { // moved there by an earlier run of this process
			base = filepath.Dir(own)
		}
		m.parent = filepath.Join(base, name)
	} else {
		m.parent = name
		if err := m.findV1(); err != nil {
			sup.Reason = fmt.Sprintf("cannot find the cgroup v1 hierarchies (%v)", err)
			return nil, sup
		}
	}
	probe := "probe-" + strconv.Itoa(os.Getpid())
	cg, err := m.create(probe, session.Limits{Pids: 64})
	if err != nil && mode == unified && errors.Is(err, errBusy) {
		if err = moveSelfToLeaf(filepath.Dir(m.parent)); err == nil {
			cg, err = m.create(probe, session.Limits{Pids: 64})
		}
	}
	if err != nil {
		sup.Reason = fmt.Sprintf("cannot create cgroups (%v): run the daemon as root, or under systemd with Delegate=yes on a cgroup v2 host", err)
		return nil, sup
	}
	if err := cg.Remove(); err != nil {
		sup.Reason = fmt.Sprintf("cannot remove cgroups (%v)", err)
		return nil, sup
	}
	for _, d := range cg.Dirs {
		m.parentDirs = append(m.parentDirs, filepath.Dir(d))
	}
	sup.Available = true
	return m, sup
}

var errBusy = errors.New("the daemon's cgroup holds processes")

// Close removes the daemon's parent cgroup when no session cgroup is left
// in it (a stopped daemon whose sessions go on keeps it).
func (m *Manager) Close() {
	for _, d := range m.parentDirs {
		// Up through the levels the name made (agentconnect/<home>): the
		// shared agentconnect level goes with the last daemon's. A removal
		// fails, harmlessly, while a session's cgroup or another daemon's
		// is inside.
		for i := 0; i < m.levels && os.Remove(d) == nil; i++ {
			d = filepath.Dir(d)
		}
	}
}

// Sessions lists the session cgroups under the daemon's parent, by name
// (the session's id), each with its directory in every hierarchy.
func (m *Manager) Sessions() map[string]cgroupfs.Cgroup {
	out := map[string]cgroupfs.Cgroup{}
	for _, parent := range m.parentDirs {
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), "probe-") {
				continue
			}
			cg := out[e.Name()]
			cg.Dirs = append(cg.Dirs, filepath.Join(parent, e.Name()))
			out[e.Name()] = cg
		}
	}
	return out
}

// Dirs are the directories, one per hierarchy, of the cgroup that Create
// makes for a session: known before it is made, so that a start can name it
// in the session's record and make it beside the shim's own start.
func (m *Manager) Dirs(sessionID string) []string {
	dirs := make([]string, len(m.parentDirs))
	for i, p := range m.parentDirs {
		dirs[i] = filepath.Join(p, sessionID)
	}
	return dirs
}

// Create makes the cgroup of one session with its limits, where Dirs says.
// A zero pids limit becomes DefaultPids.
func (m *Manager) Create(sessionID string, l session.Limits) (cgroupfs.Cgroup, error) {
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	cg, err := m.create(sessionID, l)
	if err != nil {
		return cgroupfs.Cgroup{}, fmt.Errorf("create cgroup of session %s: %w", sessionID, err)
	}
	return cg, nil
}

func (m *Manager) create(name string, l session.Limits) (cgroupfs.Cgroup, error) {
	if m.mode == unified {
		return m.createV2(name, l)
	}
	return m.createV1(name, l)
}

// v1Controllers are the v1 controllers a session joins, in the order of its
// directories (the order containerd's cgroups library, used before, gave
// them: a session recorded by an older daemon is found where it was): those
// that limit it, and cpuacct, which counts its cpu time.
var v1Controllers = []string{"pids", "cpu", "cpuacct", "memory"}

// limiter says whether a v1 controller carries a limit: a host without it
// is refused rather than run without the limit. cpuacct only counts.
func limiter(controller string) bool { return controller != "cpuacct" }

// findV1 finds the parent's directory in each v1 controller: below the
// daemon's own cgroup there, as /proc/self/cgroup names it.
func (m *Manager) findV1() error {
	own, err := ownCgroups()
	if err != nil {
		return err
	}
	m.v1Parents = map[string]string{}
	for _, c := range v1Controllers {
		mount := filepath.Join(cgroupRoot, c)
		if _, err := os.Lstat(mount); err != nil {
			continue
		}
		if p, ok := own[c]; ok {
			m.v1Parents[c] = filepath.Join(mount, p, m.parent)
		}
	}
	return nil
}

// createV1 makes the cgroup in each v1 controller and writes its limits
// there. On error nothing it made is left.
func (m *Manager) createV1(name string, l session.Limits) (_ cgroupfs.Cgroup, retErr error) {
	var out cgroupfs.Cgroup
	defer func() {
		if retErr != nil {
			out.Remove()
		}
	}()
	for _, c := range v1Controllers {
		parent, ok := m.v1Parents[c]
		if !ok {
			if limiter(c) {
				return out, fmt.Errorf("cgroup v1 controller %s is not mounted at %s", c, filepath.Join(cgroupRoot, c))
			}
			continue
		}
		dir := filepath.Join(parent, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			if limiter(c) {
				return out, fmt.Errorf("cgroup v1 controller %s: %w", c, err)
			}
			continue
		}
		out.Dirs = append(out.Dirs, dir)
		for _, v := range v1Values(c, l) {
			if err := writeValue(dir, v); err != nil {
				return out, fmt.Errorf("cgroup v1 controller %s: %w", c, err)
			}
		}
	}
	if len(out.Dirs) == 0 {
		return out, errors.New("no cgroup v1 controller is mounted")
	}
	return out, nil
}

// value is one limit: a cgroup file and what goes in it.
type value struct{ file, data string }

func writeValue(dir string, v value) error {
	if err := cgroupfs.WriteFile(filepath.Join(dir, v.file), v.data); err != nil {
		return fmt.Errorf("set %s to %s in %s: %w", v.file, v.data, dir, err)
	}
	return nil
}

// v1Values are l's limits in controller c of a v1 hierarchy.
func v1Values(c string, l session.Limits) []value {
	switch {
	case c == "pids":
		return []value{{"pids.max", strconv.FormatInt(l.Pids, 10)}}
	case c == "memory" && l.MemoryMiB > 0:
		return []value{{"memory.limit_in_bytes", strconv.FormatInt(l.MemoryMiB<<20, 10)}}
	case c == "cpu" && l.CPUs > 0:
		// The period first: the kernel checks the quota against it.
		return []value{{"cpu.cfs_period_us", strconv.Itoa(cpuPeriod)}, {"cpu.cfs_quota_us", strconv.FormatInt(int64(l.CPUs)*cpuPeriod, 10)}}
	}
	return nil
}

// createV2 makes the cgroup in the unified hierarchy, gives each level
// above it the controllers its limits need, and writes them.
func (m *Manager) createV2(name string, l session.Limits) (cgroupfs.Cgroup, error) {
	dir := filepath.Join(m.v2Root, m.parent, name)
	values := []value{{"pids.max", strconv.FormatInt(l.Pids, 10)}}
	controllers := []string{"+pids"}
	if l.MemoryMiB > 0 {
		values = append(values, value{"memory.max", strconv.FormatInt(l.MemoryMiB<<20, 10)})
		controllers = append(controllers, "+memory")
	}
	if l.CPUs > 0 {
		values = append(values, value{"cpu.max", fmt.Sprintf("%d %d", int64(l.CPUs)*cpuPeriod, cpuPeriod)})
		controllers = append(controllers, "+cpu")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return cgroupfs.Cgroup{}, err
	}
	// Every level from the root down to the parent hands the controllers
	// on (cgroup.subtree_control), top down: a level can hand on only
	// what it was given. A level above the daemon's own may refuse (a
	// delegated subtree), which is harmless where it hands them on
	// already, so only the parent's answer counts.
	var lastErr error
	rel, _ := filepath.Rel(m.v2Root, filepath.Dir(dir))
	level := m.v2Root
	for _, part := range append([]string{""}, strings.Split(rel, "/")...) {
		level = filepath.Join(level, part)
		lastErr = writeValue(level, value{"cgroup.subtree_control", strings.Join(controllers, " ")})
	}
	if lastErr != nil {
		os.Remove(dir)
		if errors.Is(lastErr, unix.EBUSY) {
			return cgroupfs.Cgroup{}, fmt.Errorf("%w: %v", errBusy, lastErr)
		}
		return cgroupfs.Cgroup{}, lastErr
	}
	for _, v := range values {
		if err := writeValue(dir, v); err != nil {
			os.Remove(dir)
			return cgroupfs.Cgroup{}, err
		}
	}
	return cgroupfs.Cgroup{Dirs: []string{dir}}, nil
}

// ownCgroups reads this process's cgroup in each hierarchy from
// /proc/self/cgroup, by controller ("4:memory:/a/b", "1:cpu,cpuacct:/a/b");
// the v2 one ("0::/a/b") under "".
func ownCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read own cgroup: %w", err)
	}
	own := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own, nil
}

// ownV2Group is this process's cgroup v2 path.
func ownV2Group() (string, error) {
	own, err := ownCgroups()
	if err != nil {
		return "", err
	}
	p, ok := own[""]
	if !ok {
		return "", errors.New("this process has no cgroup v2 path")
	}
	return p, nil
}

// moveSelfToLeaf moves this process into group/supervisor.
func moveSelfToLeaf(group string) error {
	leaf := filepath.Join(cgroupRoot, group, "supervisor")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return err
	}
	return cgroupfs.Cgroup{Dirs: []string{leaf}}.Add(os.Getpid())
}
