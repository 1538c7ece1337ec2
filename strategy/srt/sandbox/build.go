package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/protect"
)

// always replaced by empty directories or private tmpfs: other users'
// homes, shared temporary storage, and every host socket under /run.
var emptyTopLevel = map[string]string{
	"home": "--dir", "root": "--dir", "tmp": "--tmpfs", "run": "--tmpfs", "lost+found": "",
}

// builder collects bwrap arguments and the files they refer to by fd.
type builder struct {
	args  []string
	files []*os.File
	// readOnlyLater are tmpfs directories made for new mount points, made
	// read-only once the mounts are in.
	readOnlyLater []string
	// view is what the sandbox shows of the host, for its sockets.
	view view
}

func (b *builder) add(args ...string) { b.args = append(b.args, args...) }

// fd adds f to the files passed to bwrap and returns its fd number there.
func (b *builder) fd(f *os.File) string {
	b.files = append(b.files, f)
	return strconv.Itoa(firstBindFD + len(b.files) - 1)
}

// Build opens the agent's directories and returns the boundary for cfg.
// exe is the shim binary (an O_PATH fd of /proc/self/exe), bound into the
// sandbox to run sandbox-exec. With premount, the protected names beneath
// the writable roots are left to Boundary.Premount, and bwrap binds only
// the roots (recursively, so that they come with them). On error nothing
// stays open and no placeholder is left.
func Build(cfg Config, exe *os.File, landlockRoots, premount bool) (_ *Boundary, retErr error) {
	b := &builder{}
	var plan *protect.Plan
	defer func() {
		if retErr != nil {
			for _, f := range b.files {
				f.Close()
			}
			if plan != nil {
				plan.Release()
			}
		}
	}()
	b.add("--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")
	if !cfg.NestedSandbox {
		// A second lock beside seccomp's: no user namespace can be made
		// inside, so nothing can be remounted there.
		b.add("--disable-userns")
	}
	b.add("--die-with-parent", "--new-session", "--cap-drop", "ALL",
		"--json-status-fd", strconv.Itoa(FDStatus), "--seccomp", strconv.Itoa(FDSeccomp))
	if err := b.systemView(cfg); err != nil {
		return nil, err
	}
	for _, m := range cfg.Mounts {
		if err := b.makeRoom(m.Target, cfg); err != nil {
			return nil, err
		}
	}
	// The writable roots, each opened once: what is bound is what is
	// protected.
	roots, err := protect.OpenAgentDirs(cfg.AgentDir, cfg.SharedWorkspace, cfg.Workspace, cfg.Home, cfg.Memory, cfg.Tmp)
	if err != nil {
		return nil, err
	}
	for _, r := range roots {
		b.view.binds = append(b.view.binds, bind{r.Host, r.Target})
	}
	for _, m := range cfg.Mounts {
		b.view.binds = append(b.view.binds, bind{m.Source, m.Target})
	}
	roFiles := map[int]*os.File{}
	closeAll := func() {
		for _, r := range roots {
			r.Dir.Close()
		}
		for _, f := range roFiles {
			f.Close()
		}
	}
	for i, m := range cfg.Mounts {
		// The source was resolved when the agent was saved; a symlink put
		// in its place since is refused rather than followed.
		f, err := protect.OpenNoSymlinks(m.Source)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("mount %s: %w", m.Source, err)
		}
		if m.ReadOnly {
			roFiles[i] = f
		} else {
			roots = append(roots, protect.Root{Host: m.Source, Dir: f, Target: m.Target})
		}
	}
	plan, err = protect.Prepare(cfg.Ledger, roots)
	for _, r := range roots {
		r.Dir.Close() // the plan holds its own
	}
	roots = nil
	if err != nil {
		closeAll()
		return nil, err
	}
	// In the order given, each root with its protected names right after
	// it: the agent's four directories, then the mounts.
	var writable []string
	next := 0
	bindRoot := func() {
		rp := plan.Roots[next]
		next++
		writable = append(writable, rp.Binds[0].Target)
		binds := rp.Binds
		if premount {
			binds = binds[:1]
		}
		for _, bd := range binds {
			op := "--bind-fd"
			if bd.ReadOnly {
				op = "--ro-bind-fd"
			}
			b.add(op, b.fd(bd.File), bd.Target)
		}
	}
	for range 4 {
		bindRoot()
	}
	for i, m := range cfg.Mounts {
		if m.ReadOnly {
			b.add("--ro-bind-fd", b.fd(roFiles[i]), m.Target)
		} else {
			bindRoot()
		}
	}
	checks, err := protect.ChecksFile(plan.Checks())
	if err != nil {
		return nil, err
	}
	b.hideCredentials(cfg)
	// Unix sockets are the sandbox's to make and use (seccomp allows
	// them); the host's are covered wherever the view shows one.
	socks, err := b.view.hostSockets(cfg.SocketCache)
	if err != nil {
		return nil, err
	}
	for _, p := range socks {
		b.add("--ro-bind", "/dev/null", p)
	}
	b.add("--ro-bind-fd", b.fd(dup(exe)), ShimPath)
	if cfg.CABundle != nil {
		b.add("--ro-bind-fd", b.fd(dup(cfg.CABundle)), session.CABundlePath)
	}
	for _, d := range b.readOnlyLater {
		b.add("--remount-ro", d)
	}
	// The root itself was a writable tmpfs while the view was built.
	b.add("--remount-ro", "/", "--chdir", cfg.Workspace, "--", ShimPath, "sandbox-exec")
	for _, l := range []int{HTTPProxyPort, SOCKSProxyPort} {
		b.add("--listen", "127.0.0.1:"+strconv.Itoa(l))
	}
	if landlockRoots && !cfg.NestedSandbox {
		for _, w := range append(writable, "/tmp", "/dev", "/run") {
			b.add("--writable", w)
		}
	}
	bd := &Boundary{Args: b.args, Files: b.files, Checks: checks, plan: plan}
	if premount {
		roots := plan.Roots
		bd.Premount = func() error { return protect.Premount(roots) }
	}
	return bd, nil
}

func dup(f *os.File) *os.File {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return f
	}
	return os.NewFile(uintptr(fd), f.Name())
}

// systemView lays out the root: each top-level entry of the host read-only,
// except the ones that are replaced by empty ones, a fresh /proc and /dev,
// and the hidden directories covered by empty tmpfs.
func (b *builder) systemView(cfg Config) error {
	entries, err := os.ReadDir("/")
	if err != nil {
		return fmt.Errorf("read /: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		p := "/" + name
		switch {
		case name == "proc":
			b.add("--proc", p)
		case name == "dev":
			b.add("--dev", p, "--tmpfs", "/dev/shm")
		case emptyTopLevel[name] != "":
			b.add(emptyTopLevel[name], p)
		case name == "lost+found":
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			b.add("--symlink", target, p)
		default:
			b.add("--ro-bind", p, p)
			b.view.tops = append(b.view.tops, p)
		}
	}
	hidden := append([]string{"/var/tmp", cfg.DaemonHome}, cfg.Hidden...)
	sort.Strings(hidden)
	for _, h := range hidden {
		if h == "" || !isDir(h) || underEmptyTopLevel(h) {
			continue
		}
		b.add("--tmpfs", h)
		b.view.hidden = append(b.view.hidden, h)
	}
	return nil
}

// hideCredentials covers each credential file that a mount or the shared
// workspace shows, at its path inside: a directory with an empty read-only
// tmpfs, a file with /dev/null.
func (b *builder) hideCredentials(cfg Config) {
	type root struct{ source, target string }
	var roots []root
	if cfg.SharedWorkspace {
		roots = append(roots, root{cfg.Workspace, cfg.Workspace})
	}
	for _, m := range cfg.Mounts {
		roots = append(roots, root{m.Source, m.Target})
	}
	for _, r := range roots {
		src, err := filepath.EvalSymlinks(r.source)
		if err != nil {
			continue
		}
		for _, c := range cfg.Credentials {
			if !within(src, c) {
				continue
			}
			rel, _ := filepath.Rel(src, c)
			inside := filepath.Join(r.target, rel)
			if isDir(c) {
				b.add("--tmpfs", inside)
				b.readOnlyLater = append(b.readOnlyLater, inside)
			} else {
				b.add("--ro-bind", "/dev/null", inside)
			}
			b.view.covered = append(b.view.covered, inside)
		}
	}
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// underEmptyTopLevel reports whether p is below a top-level directory that
// the view replaces anyway (/home, /root, /tmp, /run).
func underEmptyTopLevel(p string) bool {
	first, _, _ := strings.Cut(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
	return emptyTopLevel[first] != ""
}

// makeRoom makes sure a mount can be placed at target: a new mount point
// needs a writable directory to be made in, and the host's read-only view
// offers none. The deepest existing directory on the way is replaced by a
// tmpfs holding its entries again, bound read-only one by one.
func (b *builder) makeRoom(target string, cfg Config) error {
	target = filepath.Clean(target)
	if _, err := os.Lstat(target); err == nil {
		return nil // an existing path is a mount point already
	}
	parent := filepath.Dir(target)
	for {
		if _, err := os.Lstat(parent); err == nil {
			break
		}
		parent = filepath.Dir(parent)
	}
	if parent == "/" || underEmptyTopLevel(target) || within(cfg.DaemonHome, parent) {
		return nil // a tmpfs already: the root, /tmp, /run, a hidden directory
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return fmt.Errorf("mount target %s: read %s: %w", target, parent, err)
	}
	b.add("--tmpfs", parent)
	for _, e := range entries {
		p := filepath.Join(parent, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			b.add("--symlink", t, p)
			continue
		}
		b.add("--ro-bind", p, p)
	}
	b.readOnlyLater = append(b.readOnlyLater, parent)
	return nil
}

// within reports whether p is dir or below it.
func within(dir, p string) bool {
	if dir == "" {
		return false
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
