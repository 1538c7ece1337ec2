// Package protect keeps a boundary's runtime from planting what tools on the
// host trust and run: git hooks and repository config, shell rc files, editor,
// MCP and Claude Code settings. srt (bind mounts) and microsandbox (virtiofs
// shares, served by a virtiofsd the guest cannot reconfigure) use it alike.
//
// For each writable root a boundary shares, Prepare finds those names, opens
// each by fd beneath the root (no symlink followed), makes placeholders for
// the absent ones so they cannot be created, gives a workspace with no
// repository one, and returns the binds the boundary applies: git directories
// read-write (so they are mount points that cannot be renamed away) and the
// protected names read-only. With each bind goes the identity of what was
// opened, which Verify checks inside the boundary once its mounts are in: a
// component swapped for a symlink between the scan and the mount (by a
// concurrent session of the same agent, say) stops the start.
package protect

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Names that tools on the host trust and run, made read-only in every
// writable root and kept from being created where they are absent: a runtime
// that planted one would run code outside its boundary the next time a host
// tool (git, a shell, an editor, an MCP client) read it.
var (
	protectedFiles = []string{
		".gitconfig", ".gitmodules", // git runs what they name
		".bashrc", ".bash_profile", ".zshrc", ".zprofile", ".profile", // shells source them
		".mcp.json", // MCP clients start the servers it lists
		// Claude Code runs the hooks they define; it reads an absent one
		// made a directory as no settings.
		".claude/settings.json", ".claude/settings.local.json",
	}
	protectedDirs = []string{
		".vscode", ".idea", // editors run their tasks
		".claude/commands", ".claude/agents", ".claude/skills", // Claude Code runs them
	}
)

// The parts of a git directory that make git run code, and the placeholder
// each gets where it is absent: hooks; config (hook paths, filters,
// aliases, fsmonitor), an empty file being an empty config; config.worktree,
// read when the config enables it; commondir, which moves the config and the
// hooks to another directory, and whose placeholder names the git directory
// itself (an empty one would break the repository).
var gitProtected = []struct {
	name string
	ph   kind
}{
	{"hooks", kind{dir: true}},
	{"config", kind{}},
	{"config.worktree", kind{}},
	{"commondir", kind{content: ".\n"}},
}

// fileID is a file's device and inode.
type fileID struct{ dev, ino uint64 }

// kind is what a placeholder is: an empty directory, or a file holding
// content.
type kind struct {
	dir     bool
	content string
}

// Root is one writable directory a boundary shares.
type Root struct {
	// Host is the directory on the host, for messages and the ledger.
	Host string
	// Dir is an O_PATH fd of Host: the very directory the boundary binds.
	// Everything is looked up beneath it.
	Dir *os.File
	// Target is where the boundary shows the root.
	Target string
	// Home is the runtime's home: shells source rc files from it, so an
	// absent one becomes an empty file; elsewhere an empty directory, which
	// git ignores, so a repository's status does not change.
	Home bool
	// Workspace roots with no repository get one (see ensureRepository).
	Workspace bool
}

// Bind is one mount the boundary applies, in order.
type Bind struct {
	File     *os.File // O_PATH fd of what is bound
	Target   string   // where, inside the boundary
	ReadOnly bool
}

// Check is what Verify expects to find at Rel beneath Root once the
// boundary's mounts are in: the object that was bound there.
type Check struct {
	Root     string `json:"root"` // a root's target
	Rel      string `json:"rel"`  // "." for the root itself
	Dev      uint64 `json:"dev"`
	Ino      uint64 `json:"ino"`
	ReadOnly bool   `json:"readOnly"`
}

// RootPlan is the protection of one root.
type RootPlan struct {
	// Host is the root's directory on the host ("" for a root shared
	// read-only, which has no binds beneath it).
	Host   string
	Binds  []Bind
	Checks []Check
}

// Plan is the protection of a boundary's roots, in the order given.
type Plan struct {
	Roots []RootPlan
	// GitDirs are the git directories protected (host paths): Audit
	// reports on the others at the end of the run.
	GitDirs []string
	// gitDirIDs are the GitDirs' devices and inodes.
	gitDirIDs map[string]fileID

	ledger string
	roots  []Root      // with fds of their own, for Audit
	watch  *rootsWatch // from Watch until Stale
	// staleScans counts the scans Stale made, for the tests of Watch.
	staleScans int
	released   bool
}

// CloseBinds closes the fds of the plan's binds, once the boundary holds its
// own.
func (p *Plan) CloseBinds() {
	for _, r := range p.Roots {
		for _, b := range r.Binds {
			b.File.Close()
		}
	}
	p.Roots = nil
}

// Release ends the run, once its boundary is gone: it leaves the ledger
// and, when no other run is left, removes the placeholders that are still
// empty.
func (p *Plan) Release() {
	p.released = true
	p.closeFiles()
	releaseRun(p.ledger)
}

func (p *Plan) closeFiles() {
	if p.watch != nil {
		p.watch.close()
		p.watch = nil
	}
	p.CloseBinds()
	for _, r := range p.roots {
		r.Dir.Close()
	}
	p.roots = nil
}

// Prepare protects roots for a run of this process. It registers the run in
// the daemon's ledger before it looks at the roots (from then on no other
// boundary removes a placeholder this one may bind) and records the
// placeholders it makes; Release ends the run. On error nothing stays open
// and the run is not registered.
func Prepare(ledgerPath string, roots []Root) (_ *Plan, retErr error) {
	led, err := openLedger(ledgerPath)
	if err != nil {
		return nil, err
	}
	defer led.close()
	d, err := led.read()
	if err != nil {
		return nil, err
	}
	plan := &Plan{ledger: ledgerPath, gitDirIDs: map[string]fileID{}}
	var placeholders []placeholder
	defer func() {
		d.Placeholders = append(d.Placeholders, placeholders...)
		if retErr == nil {
			d.Runs = append(d.Runs, self())
		} else if len(d.Runs) == 0 {
			// Not running after all: the placeholders go unless another
			// run may have bound them.
			removePlaceholders(d.Placeholders)
			d.Placeholders = nil
		}
		if err := led.write(d); err != nil && retErr == nil {
			retErr = err
		}
		if retErr != nil {
			plan.closeFiles()
		}
	}()
	for _, r := range roots {
		own, err := dup(r.Dir)
		if err != nil {
			return nil, err
		}
		plan.roots = append(plan.roots, Root{Host: r.Host, Dir: own, Target: r.Target, Home: r.Home, Workspace: r.Workspace})
	}
	// A workspace with no repository gets one before any root is scanned:
	// another root may hold the workspace, and its scan must find the
	// repository to protect it.
	for _, r := range roots {
		if r.Workspace {
			if err := ensureRepository(r); err != nil {
				return nil, err
			}
		}
	}
	// The roots are protected all at once, each by a planner of its own: a
	// placeholder is a new inode, and on ext4 here one costs 0.3-0.4 ms of
	// CPU (tmpfs: 4 us), so a start with no other run of the agent, which
	// makes ~50 of them, spent 12-17 ms on them one root after another.
	// Roots that overlap are safe: what one planner makes is a placeholder,
	// which no other root's scan looks for, and a name made by another
	// planner meanwhile is opened (EEXIST), as one made by another session is.
	planners := make([]planner, len(roots))
	errs := make([]error, len(roots))
	var wg sync.WaitGroup
	for i, r := range roots {
		wg.Go(func() {
			planners[i].root = RootPlan{Host: r.Host}
			errs[i] = planners[i].protectRoot(r)
		})
	}
	wg.Wait()
	// Then the git directories .git files name in other roots, each
	// protected by the planner of the root that holds it.
	// Both compare paths where they lie on their filesystems.
	var mounts map[uint64]mount
	if errors.Join(errs...) == nil {
		mounts, errs[0] = readMounts()
	}
	if errors.Join(errs...) == nil {
		scans := make([]*gitScan, len(planners))
		was := make([]int, len(scans))
		for i := range planners {
			scans[i], was[i] = planners[i].scan, len(planners[i].scan.found)
		}
		for j, err := range handOver(scans, mounts) {
			errs[j] = errors.Join(errs[j], err)
			for _, g := range scans[j].found[was[j]:] {
				if errs[j] == nil {
					errs[j] = planners[j].protectGitDir(roots[j], g, scans[j].namedBy[g])
				}
			}
		}
	}
	// Then what each root protects, again in every root that holds it: a
	// rw mount of the workspace's parent shows the workspace a second
	// time, where the workspace's own binds are not (bwrap binds them at
	// its target; a VM share's virtiofsd has its own root's only).
	if errors.Join(errs...) == nil {
		errs = mirrorNested(planners, roots, mounts)
	}
	for i := range planners {
		if errs[i] == nil {
			errs[i] = planners[i].pin(roots[i])
		}
	}
	// Everything opened goes into the plan (closed with it on an error);
	// the first root's error is the start's.
	for i := range planners {
		planners[i].root.order()
		plan.Roots = append(plan.Roots, planners[i].root)
		plan.GitDirs = append(plan.GitDirs, planners[i].gitDirs...)
		maps.Copy(plan.gitDirIDs, planners[i].gitDirIDs)
		placeholders = append(placeholders, planners[i].placeholders...)
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// planner protects one root: its binds and checks, the git directories it
// protected and the placeholders it made.
type planner struct {
	root         RootPlan
	gitDirs      []string
	gitDirIDs    map[string]fileID
	placeholders []placeholder
	scan         *gitScan // nil until the root's walk
}

func (p *planner) protectRoot(r Root) error {
	d, err := dup(r.Dir)
	if err != nil {
		return err
	}
	if err := p.bind(r, ".", d, false); err != nil {
		return err
	}
	for _, name := range protectedFiles {
		if err := p.protect(r, name, kind{dir: !r.Home}); err != nil {
			return err
		}
	}
	for _, name := range protectedDirs {
		if err := p.protect(r, name, kind{dir: true}); err != nil {
			return err
		}
	}
	p.scan = newGitScan(r, nil)
	if err := p.scan.walk(); err != nil {
		return err
	}
	for _, g := range p.scan.found {
		if err := p.protectGitDir(r, g, p.scan.namedBy[g]); err != nil {
			return err
		}
	}
	return nil
}

// protectGitDir protects the git directory at rel in r, which the .git
// file namedBy names (""; found as a directory). The directory itself
// is bound onto itself first, so that it is a mount point: renaming it away
// (mv .git .git2 && mkdir .git) fails.
//
// A .git file may name any directory as its git directory: one at or
// beneath a protected name is read-only with it already, and a writable
// bind of its own would undo that (gitdir: ../.vscode made .vscode
// writable); the root itself is a mount already. Binds of directories
// above others are put before them (RootPlan.order).
func (p *planner) protectGitDir(r Root, rel, namedBy string) error {
	g, err := openBeneath(r.Dir, rel)
	if errors.Is(err, unix.ENOENT) && namedBy != "" {
		// Made during the session, it would go unprotected.
		return fmt.Errorf("%s names %s as its git directory, which does not exist: remove %s, or make the directory", namedBy, filepath.Join(r.Host, rel), namedBy)
	}
	if err != nil {
		return fmt.Errorf("git directory %s: %w", filepath.Join(r.Host, rel), describe(err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(g.Fd()), &st); err != nil {
		g.Close()
		return fmt.Errorf("git directory %s: %w", filepath.Join(r.Host, rel), err)
	}
	if p.gitDirIDs == nil {
		p.gitDirIDs = map[string]fileID{}
	}
	p.gitDirs = append(p.gitDirs, filepath.Join(r.Host, rel))
	p.gitDirIDs[filepath.Join(r.Host, rel)] = fileID{st.Dev, st.Ino}
	if beneathProtected(rel) {
		g.Close()
		return nil
	}
	if rel == "." {
		g.Close()
	} else if err := p.bind(r, rel, g, false); err != nil {
		return err
	}
	for _, gp := range gitProtected {
		if err := p.protect(r, filepath.Join(rel, gp.name), gp.ph); err != nil {
			return err
		}
	}
	return nil
}

// mirrorNested adds the binds of each root to every other root that holds
// it, each the object the inner root's plan opened; errs[i] is what stopped
// roots[i]'s.
func mirrorNested(planners []planner, roots []Root, mounts map[uint64]mount) (errs []error) {
	errs = make([]error, len(roots))
	// A root shows another beneath its own location on the filesystem, or
	// through a mount inside it (another path to the directory, bound
	// there on the host).
	views := make([]rootView, len(roots))
	own := make([]int, len(roots)) // each root's own checks, before any mirrored
	for i, r := range roots {
		views[i], errs[i] = viewOf(mounts, r.Dir)
		own[i] = len(planners[i].root.Checks)
	}
	if errors.Join(errs...) != nil {
		return errs
	}
	for i := range roots {
		for j := range roots {
			if i == j {
				continue
			}
			for _, off := range views[i].shows(mounts, views[j].loc) {
				for _, c := range planners[j].root.Checks[1:own[j]] {
					if errs[i] == nil {
						errs[i] = planners[i].mirror(roots[i], filepath.Join(off, c.Rel), c)
					}
				}
			}
		}
	}
	return errs
}

// pin binds every directory on the way from the root to each of the
// plan's binds writable onto itself, so that it is a mount point: renaming
// one away and making it anew (mv .claude x && mkdir -p .claude/commands;
// mv sub x && git init sub) fails, as renaming a git directory does, where
// it would take the binds beneath it along and leave the new one
// unprotected. The runtime cannot rename or remove those directories.
func (p *planner) pin(r Root) error {
	have := map[string]bool{}
	for _, c := range p.root.Checks {
		have[c.Rel] = true
	}
	for _, c := range slices.Clone(p.root.Checks) {
		for a := filepath.Dir(c.Rel); a != "." && a != "/"; a = filepath.Dir(a) {
			if have[a] {
				continue
			}
			have[a] = true
			f, err := openBeneath(r.Dir, a)
			if err != nil {
				return fmt.Errorf("%s cannot be protected: %w", filepath.Join(r.Host, a), describe(err))
			}
			if err := p.bind(r, a, f, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// mirror binds rel in r as c, another root's check of the same object, says.
func (p *planner) mirror(r Root, rel string, c Check) error {
	if slices.ContainsFunc(p.root.Checks, func(o Check) bool { return o.Rel == rel && o.ReadOnly == c.ReadOnly }) {
		return nil
	}
	f, err := openBeneath(r.Dir, rel)
	if err != nil {
		return fmt.Errorf("%s cannot be protected: %w", filepath.Join(r.Host, rel), describe(err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Dev != c.Dev || st.Ino != c.Ino {
		f.Close()
		return fmt.Errorf("protected path %s changed while the boundary was planned: start the session again", filepath.Join(r.Host, rel))
	}
	return p.bind(r, rel, f, c.ReadOnly)
}

// beneathProtected reports whether rel is a protected name or beneath one.
func beneathProtected(rel string) bool {
	for q := rel; q != "." && q != "/"; q = filepath.Dir(q) {
		if boundReadOnly[q] {
			return true
		}
	}
	return false
}

// order puts the root's binds in the order of their depth, keeping the
// order of those at the same depth: a bind covers what was bound beneath
// its target before it, so a git directory above a protected name (one a
// .git file names: gitdir: ../.claude) is bound before the name, not over
// it. The root's own bind stays first.
func (r *RootPlan) order() {
	depth := func(rel string) int {
		if rel == "." {
			return 0
		}
		return strings.Count(rel, "/") + 1
	}
	// A writable bind at or beneath a read-only one (a git directory a
	// .git file names at another's hooks: gitdir: ../.git/hooks) would
	// undo it: it is left out, the directory being read-only with it.
	var readOnly []string
	for _, c := range r.Checks[1:] {
		if c.ReadOnly {
			readOnly = append(readOnly, c.Rel)
		}
	}
	covered := func(rel string) bool {
		return slices.ContainsFunc(readOnly, func(ro string) bool { return rel == ro || strings.HasPrefix(rel, ro+"/") })
	}
	var idx []int
	for i, c := range r.Checks {
		if i == 0 || c.ReadOnly || !covered(c.Rel) {
			idx = append(idx, i)
		} else {
			r.Binds[i].File.Close()
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(depth(r.Checks[a].Rel), depth(r.Checks[b].Rel)) })
	binds, checks := make([]Bind, len(idx)), make([]Check, len(idx))
	for k, i := range idx {
		binds[k], checks[k] = r.Binds[i], r.Checks[i]
	}
	r.Binds, r.Checks = binds, checks
}

// protect binds rel in r read-only, or a placeholder of kind ph where it is
// absent.
func (p *planner) protect(r Root, rel string, ph kind) error {
	f, err := openBeneath(r.Dir, rel)
	switch {
	case err == nil:
		if err := checkLinks(f, filepath.Join(r.Host, rel)); err != nil {
			f.Close()
			return err
		}
	case errors.Is(err, unix.ENOENT):
		if f, rel, err = p.placeholder(r, rel, ph); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%s cannot be made read-only: %w", filepath.Join(r.Host, symlinkOnTheWay(r.Dir, rel, err)), describe(err))
	}
	return p.bind(r, rel, f, true)
}

// symlinkOnTheWay names the first symlink on the way to rel, when err says
// there is one, so the message points at what to replace; else rel.
func symlinkOnTheWay(dir *os.File, rel string, err error) string {
	if !errors.Is(err, unix.ELOOP) {
		return rel
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		q := strings.Join(parts[:i+1], "/")
		var st unix.Stat_t
		if unix.Fstatat(int(dir.Fd()), q, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return q
		}
	}
	return rel
}

// bind adds f's bind at rel and what Verify will check there.
func (p *planner) bind(r Root, rel string, f *os.File, readOnly bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return fmt.Errorf("stat %s: %w", filepath.Join(r.Host, rel), err)
	}
	target := r.Target
	if rel != "." {
		target = filepath.Join(r.Target, rel)
	}
	p.root.Binds = append(p.root.Binds, Bind{File: f, Target: target, ReadOnly: readOnly})
	p.root.Checks = append(p.root.Checks, Check{Root: r.Target, Rel: rel, Dev: st.Dev, Ino: st.Ino, ReadOnly: readOnly})
	return nil
}

// placeholder makes a placeholder of kind ph at rel in r, and the parents it
// needs, each beneath r without following a symlink, records
// them for removal after the run, and opens it. Where a parent on the way is
// a file (.claude is a file, say), nothing can be created beneath it, so that
// file is what is protected: bound read-only, it cannot be replaced by a
// directory either.
func (p *planner) placeholder(r Root, rel string, ph kind) (*os.File, string, error) {
	parts := strings.Split(rel, "/")
	dir, err := dup(r.Dir)
	if err != nil {
		return nil, "", err
	}
	defer func() { dir.Close() }()
	for i, part := range parts {
		sofar := strings.Join(parts[:i+1], "/")
		last := i == len(parts)-1
		f, err := openBeneath(dir, part)
		if errors.Is(err, unix.ENOENT) {
			switch {
			case !last || ph.dir:
				err = unix.Mkdirat(int(dir.Fd()), part, 0o755)
				if last {
					// Read-only anyway once bound; this says so on the host.
					err = errors.Join(err, unix.Fchmodat(int(dir.Fd()), part, 0o555, 0))
				}
			default:
				var fd int
				fd, err = unix.Openat(int(dir.Fd()), part, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
				if err == nil {
					_, err = unix.Write(fd, []byte(ph.content))
					unix.Close(fd)
				}
			}
			switch {
			case err == nil:
				p.placeholders = append(p.placeholders, placeholder{Root: r.Host, Rel: sofar})
			case errors.Is(err, unix.EEXIST):
				// Made meanwhile, by the runtime of another session: open it.
			default:
				return nil, "", fmt.Errorf("placeholder %s: %w", filepath.Join(r.Host, sofar), err)
			}
			f, err = openBeneath(dir, part)
		}
		if err != nil {
			return nil, "", fmt.Errorf("%s cannot be made read-only: %w", filepath.Join(r.Host, sofar), describe(err))
		}
		if last {
			return f, sofar, nil
		}
		if fi, err := f.Stat(); err == nil && !fi.IsDir() {
			if err := checkLinks(f, filepath.Join(r.Host, sofar)); err != nil {
				f.Close()
				return nil, "", err
			}
			return f, sofar, nil
		}
		dir.Close()
		dir = f
	}
	return nil, "", fmt.Errorf("placeholder %s: empty path", r.Host)
}

// Bounds on looking inside a protected directory for hard links.
const (
	linkScanDepth   = 4
	linkScanEntries = 2000
)

// checkLinks refuses a protected file with another hard link, or a protected
// directory holding one: a link elsewhere in a writable root would change it
// through the other name.
func checkLinks(f *os.File, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if st.Nlink > 1 {
			return hardLinkError(path, st.Nlink)
		}
	case unix.S_IFDIR:
		seen := 0
		return walkLinks(procPath(f), path, 0, &seen)
	}
	return nil
}

func walkLinks(dir, shown string, depth int, seen *int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil // unreadable: the host's tools cannot read it either
	}
	for _, e := range entries {
		if *seen++; *seen > linkScanEntries {
			return fmt.Errorf("%s holds more than %d entries: too many to check for hard links; make it smaller", shown, linkScanEntries)
		}
		p := filepath.Join(dir, e.Name())
		switch {
		case e.Type().IsRegular():
			var st unix.Stat_t
			if unix.Lstat(p, &st) == nil && st.Nlink > 1 {
				return hardLinkError(filepath.Join(shown, e.Name()), st.Nlink)
			}
		case e.IsDir() && depth < linkScanDepth:
			if err := walkLinks(p, filepath.Join(shown, e.Name()), depth+1, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

func hardLinkError(path string, n uint64) error {
	return fmt.Errorf("%s has %d hard links, and a link in a writable directory would change it: remove the other links (find them with find / -samefile %s)", path, n, path)
}

// ReadOnly is the plan of a root shared read-only: the root bound read-only
// at target from f, and the check that it is. Nothing beneath it needs
// protecting.
func ReadOnly(f *os.File, target string) (RootPlan, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return RootPlan{}, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return RootPlan{
		Binds:  []Bind{{File: f, Target: target, ReadOnly: true}},
		Checks: []Check{{Root: target, Rel: ".", Dev: st.Dev, Ino: st.Ino, ReadOnly: true}},
	}, nil
}

// OpenAgentDirs opens an agent's four directories as the first writable
// roots of a boundary, each seen at its own path: each beneath the agent
// directory without following a symlink (a shared workspace by its own path,
// likewise), so that a symlink planted by an earlier session cannot redirect
// one.
func OpenAgentDirs(agentDir string, sharedWorkspace bool, workspace, home, memory, tmp string) ([]Root, error) {
	var roots []Root
	for i, d := range []string{workspace, home, memory, tmp} {
		var f *os.File
		var err error
		if i == 0 && sharedWorkspace {
			f, err = OpenNoSymlinks(d)
		} else {
			f, err = OpenPath(agentDir, d)
		}
		if err != nil {
			for _, r := range roots {
				r.Dir.Close()
			}
			return nil, fmt.Errorf("open %s: %w", d, err)
		}
		roots = append(roots, Root{Host: d, Dir: f, Target: d, Workspace: i == 0, Home: i == 1})
	}
	return roots, nil
}

// OpenPath opens path, which must be inside root, as an O_PATH fd with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS).
func OpenPath(root, path string) (*os.File, error) {
	rel, err := filepath.Rel(root, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%s is not inside %s", path, root)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootFD)
	fd, err := unix.Openat2(rootFD, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = errors.New("a symlink is in the way (it is not followed)")
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// OpenNoSymlinks opens an absolute path as an O_PATH fd, refusing any
// symlink on the way.
func OpenNoSymlinks(path string) (*os.File, error) {
	return OpenPath("/", path)
}

// openBeneath opens rel beneath dir as an O_PATH fd with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS): no symlink is followed, the
// last component's included.
func openBeneath(dir *os.File, rel string) (*os.File, error) {
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), rel)), nil
}

// describe says what an openat2 error means for a protected path.
func describe(err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return errors.New("a symlink is in the way, and a mount on a symlink would land where it points: replace it with the file or directory it points to")
	case errors.Is(err, unix.EXDEV):
		return errors.New("it leads out of its directory")
	}
	return err
}

// dup returns a second fd of f, so that the plan owns what it closes.
func dup(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// procPath names f's directory for path-based reads without resolving its
// path again: a path through /proc/self/fd is the very directory opened.
func procPath(f *os.File) string {
	return "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
}

// Stale reports whether the roots now hold a git directory the plan does
// not protect (a repository made since Prepare, by another session of the
// agent, say): a boundary built from the plan ahead of its session (a warm
// one) must then be built again, or it would protect less than a start now.
// After Watch, the roots are scanned again only if the watch saw a change
// that could add one; the watch ends with the first call.
func (p *Plan) Stale() (bool, error) {
	if p.released {
		return false, errors.New("the plan was released")
	}
	if w := p.watch; w != nil {
		p.watch = nil
		unchanged := w.unchanged()
		// Closing an inotify instance waits for its marks to go (~3 ms
		// for 5000 here): not on a claim's way.
		go w.close()
		if unchanged {
			return false, nil
		}
	}
	p.staleScans++
	found, errs := scanRoots(p.roots, nil)
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	for i, dirs := range found {
		for _, g := range dirs {
			if !p.protects(p.roots[i], g) {
				return true, nil
			}
		}
	}
	return false, nil
}
