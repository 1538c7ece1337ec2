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

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

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
	mode   cgroups.CGMode
	parent string // below the daemon's own cgroup (v1), or a v2 group path
	// parentDirs are the parent's directories, one per hierarchy, and
	// levels how many of their path's last levels Setup's name made.
	parentDirs []string
	levels     int
	// v1 is the hierarchy a session joins on a v1 host, and v1Parents the
	// parent's path in each of its controllers, both found once by Setup:
	// the library would read /proc/self/mountinfo for each controller of
	// each session, and a session goes under the parent wherever the
	// daemon is moved since.
	v1        []cgroup1.Subsystem
	v1Parents map[cgroup1.Name]string
}

const unifiedMount = "/sys/fs/cgroup"

// Setup checks that this process can create cgroups by creating and removing
// one, and returns a Manager when it can. On a cgroup v2 host where the
// daemon's own cgroup is delegated to it (systemd Delegate=yes), the daemon
// moves itself into a leaf "supervisor" child first: v2 lets a cgroup either
// hold processes or give controllers to children, not both.
func Setup(name string) (*Manager, Support) {
	mode := cgroups.Mode()
	m := &Manager{mode: mode, levels: strings.Count(filepath.Clean(name), "/") + 1}
	var sup Support
	switch mode {
	case cgroups.Legacy:
		sup.Mode = "v1"
	case cgroups.Hybrid:
		sup.Mode = "hybrid"
	case cgroups.Unified:
		sup.Mode = "v2"
	default:
		sup.Reason = "no cgroup filesystem is mounted at /sys/fs/cgroup"
		return nil, sup
	}
	if mode == cgroups.Unified {
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
	if err != nil && mode == cgroups.Unified && errors.Is(err, errBusy) {
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
	if m.mode == cgroups.Unified {
		return m.createV2(name, l)
	}
	return m.createV1(name, l)
}

// v1Controllers are the hierarchies a session joins on a v1 host: those that
// limit it and the one that counts its cpu time.
var v1Controllers = map[cgroup1.Name]bool{cgroup1.Pids: true, cgroup1.Memory: true, cgroup1.Cpu: true, cgroup1.Cpuacct: true}

// findV1 finds the v1 hierarchy and the parent's path in each of its
// controllers: below the daemon's own cgroup there.
func (m *Manager) findV1() error {
	all, err := cgroup1.Default()
	if err != nil {
		return err
	}
	parent := cgroup1.NestedPath(m.parent)
	m.v1Parents = map[cgroup1.Name]string{}
	for _, s := range all {
		if !v1Controllers[s.Name()] {
			continue
		}
		m.v1 = append(m.v1, s)
		if p, err := parent(s.Name()); err == nil {
			m.v1Parents[s.Name()] = p
		}
	}
	return nil
}

// v1Path is where the cgroup name goes in each controller of the v1
// hierarchy: under the parent.
func (m *Manager) v1Path(name string) cgroup1.Path {
	return func(n cgroup1.Name) (string, error) {
		p, ok := m.v1Parents[n]
		if !ok {
			return "", cgroup1.ErrControllerNotActive
		}
		return filepath.Join(p, name), nil
	}
}

type pather interface{ Path(string) string }

func (m *Manager) createV1(name string, l session.Limits) (cgroupfs.Cgroup, error) {
	pids := l.Pids
	res := &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &pids}}
	if l.MemoryMiB > 0 {
		b := l.MemoryMiB << 20
		res.Memory = &specs.LinuxMemory{Limit: &b}
	}
	if l.CPUs > 0 {
		quota, period := int64(l.CPUs)*cpuPeriod, uint64(cpuPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	path := m.v1Path(name)
	hierarchy := func() ([]cgroup1.Subsystem, error) { return m.v1, nil }
	cg, err := cgroup1.New(path, res, cgroup1.WithHierarchy(hierarchy), func(c *cgroup1.InitConfig) error {
		c.InitCheck = requireLimiters
		return nil
	})
	if err != nil {
		return cgroupfs.Cgroup{}, err
	}
	var out cgroupfs.Cgroup
	for _, s := range cg.Subsystems() {
		p, perr := path(s.Name())
		ps, ok := s.(pather)
		if perr != nil || !ok {
			continue
		}
		out.Dirs = append(out.Dirs, ps.Path(p))
	}
	if len(out.Dirs) == 0 {
		return out, errors.New("no cgroup v1 controller is mounted")
	}
	return out, nil
}

// requireLimiters refuses a v1 host that lacks a controller a limit needs,
// rather than silently running without it.
func requireLimiters(s cgroup1.Subsystem, _ cgroup1.Path, err error) error {
	switch s.Name() {
	case cgroup1.Pids, cgroup1.Memory, cgroup1.Cpu:
		return fmt.Errorf("cgroup v1 controller %s: %w", s.Name(), err)
	}
	return cgroup1.ErrIgnoreSubsystem
}

func (m *Manager) createV2(name string, l session.Limits) (cgroupfs.Cgroup, error) {
	res := &cgroup2.Resources{Pids: &cgroup2.Pids{Max: l.Pids}}
	if l.MemoryMiB > 0 {
		b := l.MemoryMiB << 20
		res.Memory = &cgroup2.Memory{Max: &b}
	}
	if l.CPUs > 0 {
		quota, period := int64(l.CPUs)*cpuPeriod, uint64(cpuPeriod)
		res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(&quota, &period)}
	}
	group := filepath.Join(m.parent, name)
	if _, err := cgroup2.NewManager(unifiedMount, group, res); err != nil {
		if errors.Is(err, os.ErrExist) || strings.Contains(err.Error(), "device or resource busy") {
			return cgroupfs.Cgroup{}, fmt.Errorf("%w: %v", errBusy, err)
		}
		return cgroupfs.Cgroup{}, err
	}
	return cgroupfs.Cgroup{Dirs: []string{filepath.Join(unifiedMount, group)}}, nil
}

// ownV2Group reads this process's cgroup v2 path ("0::/path").
func ownV2Group() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("this process has no cgroup v2 path")
}

// moveSelfToLeaf moves this process into group/supervisor.
func moveSelfToLeaf(group string) error {
	leaf := filepath.Join(unifiedMount, group, "supervisor")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return err
	}
	return cgroupfs.Cgroup{Dirs: []string{leaf}}.Add(os.Getpid())
}
