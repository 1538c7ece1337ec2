package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// proc is one process of /proc.
type proc struct {
	pid, ppid int
	state     byte
	comm      string
	exe       string // the executable, when readable
	cmdline   string // the arguments joined with spaces
}

// name is how a report names the process: its executable's base name (the
// shim re-executes itself through /proc/self/exe, so comm says "exe").
func (p *proc) name() string {
	if p.exe != "" {
		return filepath.Base(strings.TrimSuffix(p.exe, " (deleted)"))
	}
	return p.comm
}

func (p *proc) String() string {
	args := p.cmdline
	if len(args) > 80 {
		args = args[:80] + "…"
	}
	return fmt.Sprintf("%d %s [%c] %s", p.pid, p.name(), p.state, args)
}

// readProcs reads every process of /proc; the ones that ended meanwhile
// are left out.
func readProcs() map[int]*proc {
	entries, _ := os.ReadDir("/proc")
	procs := map[int]*proc{}
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
		if len(fields) < 2 {
			continue
		}
		p := &proc{pid: pid, state: fields[0][0], comm: string(stat[open+1 : end])}
		p.ppid, _ = strconv.Atoi(fields[1])
		p.exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
			p.cmdline = strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
		procs[pid] = p
	}
	return procs
}

// childrenOf maps each pid to its children.
func childrenOf(procs map[int]*proc) map[int][]int {
	children := map[int][]int{}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
	}
	return children
}

// descendants lists the descendants of root, leaving out the subtrees of
// skip.
func descendants(children map[int][]int, root int, skip ...int) []int {
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

// oursProcs lists the live processes the daemon is responsible for: every
// descendant of the daemon and every orphan under the bench's subreaper
// (where shims are reparented), and any process whose command line names
// the daemon's home; not the daemon itself, the bench or what the bench
// runs. Zombies are left out: the subreaper reaps them.
func oursProcs(d *daemon) []*proc {
	procs := readProcs()
	children := childrenOf(procs)
	self, daemonPID := os.Getpid(), 0
	if !d.exited() {
		daemonPID = d.cmd.Process.Pid
	}
	ours := map[int]bool{}
	// The subreaper's other descendants: orphans reparented to it.
	for _, pid := range descendants(children, os.Getppid(), self) {
		ours[pid] = true
	}
	if daemonPID != 0 {
		for _, pid := range descendants(children, daemonPID) {
			ours[pid] = true
		}
	}
	for pid, p := range procs {
		if strings.Contains(p.cmdline, d.home) && pid != self && pid != daemonPID && p.ppid != self {
			ours[pid] = true
		}
	}
	var out []*proc
	for pid := range ours {
		if p := procs[pid]; p != nil && p.state != 'Z' && p.state != 'X' {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// cgroupRoots finds the daemon's cgroup directories of this home: the
// parent of a session cgroup (…/agentconnect/<home hash>) in every
// hierarchy that has one, found from one session's cgroup path.
func cgroupRoots(sessionCgroup string) []string {
	if sessionCgroup == "" {
		return nil
	}
	homeHash := filepath.Base(filepath.Dir(sessionCgroup))
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
		if strings.Count(strings.TrimPrefix(path, "/sys/fs/cgroup"), "/") >= 4 {
			return fs.SkipDir
		}
		return nil
	})
	sort.Strings(roots)
	return roots
}

// sessionCgroups lists the cgroup directories under roots named after one
// of ids.
func sessionCgroups(roots []string, ids map[string]bool) []string {
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

// mountsOf lists the mount points of this mount namespace under dir.
func mountsOf(dir string) []string {
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

// listTree maps every path under dir (relative) to its type.
func listTree(dir string) map[string]string {
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

// newPaths lists what is in after and not in before.
func newPaths(before, after map[string]string) []string {
	var out []string
	for p, kind := range after {
		if before[p] != kind {
			out = append(out, p+" ("+kind+")")
		}
	}
	sort.Strings(out)
	return out
}

// brief joins at most n items and says how many more there are.
func brief(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, "; ")
	}
	return strings.Join(items[:n], "; ") + fmt.Sprintf("; and %d more", len(items)-n)
}
