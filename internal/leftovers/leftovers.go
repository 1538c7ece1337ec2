// Package leftovers finds what a daemon's sessions left on the machine:
// processes of ours, session cgroups, mounts under the home, new paths in a
// directory, and a session's own files that must go with its run (its shim
// socket, its VM's socket directory). The bench and the integration tests
// check with it that nothing of a session outlives it.
package leftovers

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/home"
)

// Proc is one process of /proc.
type Proc struct {
	PID, PPID int
	State     byte
	StartTime uint64 // with PID, identifies the process
	Comm      string
	Exe       string // the executable, when readable
	Cmdline   string // the arguments joined with spaces
}

// Name is how a report names the process: its executable's base name (the
// shim re-executes itself through /proc/self/exe, so comm says "exe").
func (p *Proc) Name() string {
	if p.Exe != "" {
		return filepath.Base(strings.TrimSuffix(p.Exe, " (deleted)"))
	}
	return p.Comm
}

// Spare reports a spare shim that waits for a session
// (shimv1.StartSpare): once handed one, its command line is its serve's.
func (p *Proc) Spare() bool {
	f := strings.Fields(p.Cmdline)
	return len(f) == 2 && strings.HasPrefix(f[0], "agentconnect-shim") && f[1] == "spare"
}

// Dead reports a zombie or a dead task.
func (p *Proc) Dead() bool { return p.State == 'Z' || p.State == 'X' }

func (p *Proc) String() string {
	args := p.Cmdline
	if len(args) > 80 {
		args = args[:80] + "…"
	}
	return fmt.Sprintf("%d %s [%c] %s", p.PID, p.Name(), p.State, args)
}

// key identifies a process across two reads of /proc.
func (p *Proc) key() string { return fmt.Sprintf("%d@%d", p.PID, p.StartTime) }

// ReadProcs reads every process of /proc; the ones that ended meanwhile
// are left out.
func ReadProcs() map[int]*Proc {
	entries, _ := os.ReadDir("/proc")
	procs := map[int]*Proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open || len(stat) < end+2 {
			continue
		}
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) < 20 {
			continue
		}
		p := &Proc{PID: pid, State: fields[0][0], Comm: string(stat[open+1 : end])}
		p.PPID, _ = strconv.Atoi(fields[1])
		p.StartTime, _ = strconv.ParseUint(fields[19], 10, 64)
		p.Exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			p.Cmdline = strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
		procs[pid] = p
	}
	return procs
}

// ChildrenOf maps each pid to its children.
func ChildrenOf(procs map[int]*Proc) map[int][]int {
	children := map[int][]int{}
	for _, p := range procs {
		children[p.PPID] = append(children[p.PPID], p.PID)
	}
	return children
}

// Descendants lists the descendants of root, leaving out the subtrees of
// skip.
func Descendants(children map[int][]int, root int, skip ...int) []int {
	var out []int
	stack := append([]int(nil), children[root]...)
	for len(stack) > 0 {
		pid := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		skipped := false
		for _, s := range skip {
			skipped = skipped || pid == s
		}
		if skipped {
			continue
		}
		out = append(out, pid)
		stack = append(stack, children[pid]...)
	}
	return out
}

// Processes lists the live processes a daemon is responsible for: every
// descendant of daemon (0: none, a daemon that exited) and every orphan
// under this process's parent, the subreaper where shims are reparented
// (the bench and the integration tests run under one), and any process
// whose command line names home; not the daemon itself, this process or
// what it runs (a CLI run), nor the daemon's spare shims, which are its own
// and belong to no session. Zombies are left out: the subreaper reaps them.
func Processes(daemon int, home string) []*Proc {
	procs := ReadProcs()
	children := ChildrenOf(procs)
	self := os.Getpid()
	ours := map[int]bool{}
	for _, pid := range Descendants(children, os.Getppid(), self) {
		ours[pid] = true
	}
	if daemon != 0 {
		for _, pid := range Descendants(children, daemon) {
			ours[pid] = true
		}
	}
	for pid, p := range procs {
		if strings.Contains(p.Cmdline, home) && pid != self && pid != daemon && p.PPID != self {
			ours[pid] = true
		}
	}
	var out []*Proc
	for pid := range ours {
		if p := procs[pid]; p != nil && !p.Dead() && !(daemon != 0 && p.PPID == daemon && p.Spare()) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
}

// Baseline is a set of processes, to tell the ones that came since.
type Baseline map[string]bool

// NewBaseline records procs.
func NewBaseline(procs []*Proc) Baseline {
	b := Baseline{}
	for _, p := range procs {
		b[p.key()] = true
	}
	return b
}

// Since lists the processes of procs that are not in b.
func (b Baseline) Since(procs []*Proc) []*Proc {
	var out []*Proc
	for _, p := range procs {
		if !b[p.key()] {
			out = append(out, p)
		}
	}
	return out
}

// CgroupRoots finds the daemon's cgroup directories of this home: the
// parent of a session cgroup (…/agentconnect/<home hash>) in every
// hierarchy that has one, found from one session's cgroup path.
func CgroupRoots(sessionCgroup string) []string {
	if sessionCgroup == "" {
		return nil
	}
	return homeCgroups(filepath.Base(filepath.Dir(sessionCgroup)))
}

// DaemonCgroups finds the parent cgroup of the daemon whose home is
// homeDir (home.Layout.CgroupName) in every hierarchy that still has it. A
// daemon that stopped with no session left removes it: one found then is
// a leftover, empty or not.
func DaemonCgroups(homeDir string) []string {
	return homeCgroups(filepath.Base(home.Layout{Root: homeDir}.CgroupName()))
}

// homeCgroups finds agentconnect/<homeHash> in every hierarchy, at any
// depth the machine nests daemons (under a job's cgroup, say).
func homeCgroups(homeHash string) []string {
	var roots []string
	filepath.WalkDir("/sys/fs/cgroup", func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		if e.Name() == "agentconnect" {
			if fi, err := os.Stat(filepath.Join(path, homeHash)); err == nil && fi.IsDir() {
				roots = append(roots, filepath.Join(path, homeHash))
			}
			return fs.SkipDir
		}
		if strings.Count(strings.TrimPrefix(path, "/sys/fs/cgroup"), "/") >= 6 {
			return fs.SkipDir
		}
		return nil
	})
	sort.Strings(roots)
	return roots
}

// SessionCgroups lists the cgroup directories under roots named after one
// of ids.
func SessionCgroups(roots []string, ids map[string]bool) []string {
	var out []string
	for _, root := range roots {
		entries, _ := os.ReadDir(root)
		for _, e := range entries {
			if e.IsDir() && ids[e.Name()] {
				out = append(out, filepath.Join(root, e.Name()))
			}
		}
	}
	return out
}

// MountsUnder lists the mount points of this mount namespace under dir.
func MountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"read /proc/self/mountinfo: " + err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, dir) {
			out = append(out, line)
		}
	}
	return out
}

// ListTree maps every path under dir (relative) to its type.
func ListTree(dir string) map[string]string {
	tree := map[string]string{}
	filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		kind := "file"
		switch {
		case e.IsDir():
			kind = "dir"
		case e.Type()&fs.ModeSymlink != 0:
			kind = "symlink"
		}
		tree[rel] = kind
		return nil
	})
	return tree
}

// AgentTree is ListTree of an agent's directory without the workspace's
// repository: the shim gives a workspace one before the first boundary
// exists (so that it is protected like any other), and it stays, whatever
// becomes of the session.
func AgentTree(dir string) map[string]string {
	tree := ListTree(dir)
	for p := range tree {
		if p == "workspace/.git" || strings.HasPrefix(p, "workspace/.git/") {
			delete(tree, p)
		}
	}
	return tree
}

// NewPaths lists what is in after and not in before.
func NewPaths(before, after map[string]string) []string {
	var out []string
	for p, kind := range after {
		if before[p] != kind {
			out = append(out, p+" ("+kind+")")
		}
	}
	sort.Strings(out)
	return out
}

// Brief joins at most n items and says how many more there are.
func Brief(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:n], "; ") + fmt.Sprintf("; and %d more", len(items)-n)
}

// Run lists what the last run of session id of the daemon whose home is
// homeDir left that must go with the run: its cgroup directories (in every
// hierarchy), its shim socket, and a VM's socket directory. The run's
// files are read from its session.json.
func Run(homeDir, id string) []string {
	layout := home.Layout{Root: homeDir}
	rec, err := session.Dir(layout.SessionDir(id)).ReadRecord()
	if err != nil {
		return []string{fmt.Sprintf("session %s: read session.json: %v", id, err)}
	}
	var left []string
	exists := func(what, path string) {
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			left = append(left, what+" "+path)
		}
	}
	for _, d := range rec.Spec.Cgroup {
		exists("its cgroup", d)
	}
	exists("its shim socket", home.ShimSocket(layout.FindSocketDir(), id, rec.Run))
	if vm := rec.Spec.VM; vm != nil && vm.RunDir != "" {
		exists("its VM socket directory", vm.RunDir)
	}
	return left
}
