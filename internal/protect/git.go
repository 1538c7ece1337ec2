package protect

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Bounds on looking for nested repositories in a writable root: deep enough
// for a monorepo's packages, shallow and small enough to cost little at
// every start.
const (
	scanDepth    = 3
	scanMaxDirs  = 5000
	skipScanning = "node_modules"
	// maxModuleNameDepth bounds the directories of a submodule's name
	// (third_party/a/b: three) that the scan descends in .git/modules.
	maxModuleNameDepth = 8
)

// gitMarks are the names that make the scan protect a directory in
// .git/modules as a git directory: what git's own test needs (HEAD), hooks,
// and commondir, which moves the rest. A config alone does nothing: git
// takes no directory without HEAD for a repository. The watch sees each of
// them made (gitNames, or a directory).
var gitMarks = []string{"HEAD", "hooks", "commondir"}

// boundReadOnly is every protected name, relative to a root: a repository
// beneath one is read-only with it, whoever made it, so the scans of a
// protected root do not look there (most are empty placeholders).
var boundReadOnly = func() map[string]bool {
	m := map[string]bool{}
	for _, name := range append(protectedFiles[:len(protectedFiles):len(protectedFiles)], protectedDirs...) {
		m[name] = true
	}
	return m
}()

// findGitDirs finds the git directories of r, as paths relative to it:
// r/.git and those of repositories nested a few levels down, submodules'
// (.git/modules/...), worktrees' (.git/worktrees/...), and those a .git file
// points to, when they are inside r, but none beneath a protected name. It
// reads r through its fd, so that it scans the directory the boundary
// binds. A .git that is a symlink is refused: git follows it, and the
// symlink could be pointed anywhere. (scanRoots also follows .git files
// from one root into another.)
func findGitDirs(r Root) ([]string, error) {
	s := newGitScan(r, nil)
	err := s.walk()
	return s.found, err
}

// scanRoots finds the git directories of each of roots, as findGitDirs
// does, and gives each root those a .git file in another root names: a
// .git file in the workspace may name a git directory in home, below where
// home's own walk looks, and git on the host follows it there. With w, each
// directory looked into is watched (see Plan.Watch). errs[i] is what
// stopped the scan of roots[i], or of a git directory handed to it.
func scanRoots(roots []Root, w *rootsWatch) (found [][]string, errs []error) {
	scans := make([]*gitScan, len(roots))
	errs = make([]error, len(roots))
	for i, r := range roots {
		scans[i] = newGitScan(r, w)
		errs[i] = scans[i].walk()
	}
	mounts, err := readMounts()
	if err != nil {
		errs[0] = errors.Join(errs[0], err)
	} else {
		for j, err := range handOver(scans, mounts) {
			errs[j] = errors.Join(errs[j], err)
		}
	}
	for _, s := range scans {
		found = append(found, s.found)
	}
	return found, errs
}

// handOver adds to each scan the git directories in its root that the
// other scans found: those .git files of their roots name outside them,
// and those inside them that are in it too (the workspace inside a rw
// mount of its parent: a .git file of the mount names a git directory in
// the workspace, which the workspace's binds must protect as well); and to
// each the git directories its own .git files name by another of its paths
// (a bind mount on the host). Paths are compared where they lie on their
// filesystems (mounts). errs[j] is what adding them to scans[j] met.
func handOver(scans []*gitScan, mounts map[uint64]mount) (errs []error) {
	errs = make([]error, len(scans))
	views := make([]rootView, len(scans))
	for i, s := range scans {
		views[i], errs[i] = viewOf(mounts, s.r.Dir)
	}
	if errors.Join(errs...) != nil {
		return errs
	}
	for i, from := range scans {
		given := slices.Clone(from.elsewhere)
		for _, rel := range slices.Clone(from.found) {
			given = append(given, namedGitDir{filepath.Join(views[i].top, rel), from.namedBy[rel]})
		}
		for k, g := range given {
			loc, err := locate(mounts, g.dir)
			if err != nil {
				errs[i] = errors.Join(errs[i], err)
				continue
			}
			for j, to := range scans {
				if j == i && k >= len(from.elsewhere) {
					continue // found in its own root
				}
				for _, rel := range views[j].shows(mounts, loc) {
					if to.namedBy[rel] == "" {
						to.namedBy[rel] = g.gitFile
					}
					errs[j] = errors.Join(errs[j], to.addGitDir(rel), to.drain())
				}
			}
		}
	}
	return errs
}

// gitScan looks for the git directories of one root (see findGitDirs).
type gitScan struct {
	r     Root
	w     *rootsWatch // nil: nothing watched
	found []string    // relative to r, in the order found
	seen  map[string]bool
	// namedBy is the .git file (a host path) that named each of found
	// that one did, for the message when it is not there.
	namedBy map[string]string
	// elsewhere are the git directories .git files in r name outside it:
	// another root may hold them (handOver).
	elsewhere []namedGitDir
	visited   int
	buf       []byte
	// refused is what the scan found it cannot protect in a directory of
	// the root, and went on past, so that an audit reports what lies
	// beyond it too (drain); a start fails on any of it.
	refused []error
}

// refuse adds err, if any, to what the scan refused.
func (s *gitScan) refuse(err error) {
	if err != nil {
		s.refused = append(s.refused, err)
	}
}

// drain returns what the scan refused since the last drain.
func (s *gitScan) drain() error {
	err := errors.Join(s.refused...)
	s.refused = nil
	return err
}

// namedGitDir is a git directory (a host path) and the .git file (a host
// path) that names it.
type namedGitDir struct{ dir, gitFile string }

func newGitScan(r Root, w *rootsWatch) *gitScan {
	return &gitScan{r: r, w: w, seen: map[string]bool{}, namedBy: map[string]string{}, buf: make([]byte, 32<<10)}
}

// watchAt adds the directory at rel, which may be missing, to the watch.
func (s *gitScan) watchAt(rel string) error {
	f, err := openBeneath(s.r.Dir, rel)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("watch %s: %w", filepath.Join(s.r.Host, rel), err)
	}
	defer f.Close()
	return s.w.dir(int(f.Fd()), s.r, rel) // IN_ONLYDIR: a directory
}

// watchPath adds every directory from the root down to rel to the watch: a
// git directory a .git file names may lie where the walk does not look
// (deeper, under node_modules, in a .git, in another root), and a rename of
// any directory on its way would put another there.
func (s *gitScan) watchPath(rel string) (missing bool, err error) {
	fd, err := unix.Openat(int(s.r.Dir.Fd()), ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	at := "."
	for _, c := range strings.Split(rel, "/") {
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ENOENT) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("watch %s: %w", filepath.Join(s.r.Host, at, c), err)
		}
		fd, at = next, filepath.Join(at, c)
		if err := s.w.dir(fd, s.r, at); err != nil {
			unix.Close(fd)
			return false, err
		}
	}
	unix.Close(fd)
	return false, nil
}

// addGitDir adds the git directory at rel, with its modules' and
// worktrees'.
func (s *gitScan) addGitDir(rel string) error {
	if s.seen[rel] || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return nil
	}
	s.seen[rel] = true
	s.found = append(s.found, rel)
	if s.w != nil {
		// A git directory a .git file names may not be there yet,
		// and nothing watched need show when it comes.
		if missing, err := s.watchPath(rel); err != nil || missing {
			s.w.changed = true
			return err
		}
	}
	// A commondir moves the repository's config and hooks to the
	// directory it names, as git reads it (relative to the git
	// directory).
	switch data, err := readGitFile(s.r, filepath.Join(rel, "commondir")); {
	case errors.Is(err, unix.ENOENT):
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		// A symlink on the way, or as commondir: its protection refuses
		// it (a bind on a symlink would land where it points).
	case err != nil:
		return fmt.Errorf("%s cannot be read (%v), so the directory it names cannot be protected: make it a readable file, or remove it", filepath.Join(s.r.Host, rel, "commondir"), err)
	default:
		shown := filepath.Join(s.r.Host, rel, "commondir")
		if p, ok := gitPath(data, ""); ok {
			g, err := resolveGitPath(s.r, rel, p, shown)
			if err != nil {
				return err
			}
			if err := s.follow(filepath.Join(rel, "commondir"), data, g); err != nil {
				return err
			}
		}
	}
	if err := s.addModules(filepath.Join(rel, "modules"), 1, false); err != nil {
		return err
	}
	if s.w != nil {
		// One made later is an event of rel's.
		if err := s.watchAt(filepath.Join(rel, "worktrees")); err != nil {
			return err
		}
	}
	entries, _ := os.ReadDir(filepath.Join(procPath(s.r.Dir), rel, "worktrees"))
	for _, e := range entries {
		if e.IsDir() {
			s.refuse(s.addGitDir(filepath.Join(rel, "worktrees", e.Name())))
		}
	}
	return nil
}

// addModules adds the submodules' git directories beneath dir, a
// repository's modules or a directory of a submodule's name there: git
// keeps a submodule's at modules/<name>, and a name may have slashes
// (libs/foo, a submodule's default name at that path). A directory with
// one of gitMarks is protected as a git directory, and every directory is
// looked into for the parts of longer names, maxModuleNameDepth deep at
// most: git uses a submodule's git directory beneath another's too (git
// fetch does not check). In a git directory (gitDir), git's own
// directories are no part of a name. A symlink is refused: git follows it.
func (s *gitScan) addModules(dir string, depth int, gitDir bool) error {
	if s.w != nil {
		// One made later is an event of the repository's.
		if err := s.watchAt(dir); err != nil {
			return err
		}
	}
	entries, _ := os.ReadDir(filepath.Join(procPath(s.r.Dir), dir))
	for _, e := range entries {
		if gitDir && gitOwn[e.Name()] {
			continue
		}
		sub := filepath.Join(dir, e.Name())
		if e.Type()&fs.ModeSymlink != 0 {
			s.refuse(fmt.Errorf("%s is a symlink: git follows it to a submodule's git directory, and a symlink cannot be made read-only; replace it with the directory it points to, or remove it", filepath.Join(s.r.Host, sub)))
			continue
		}
		if !e.IsDir() {
			continue
		}
		if depth > maxModuleNameDepth {
			modules := sub // the modules directory, depth levels up
			for range depth {
				modules = filepath.Dir(modules)
			}
			s.refuse(fmt.Errorf("%s is nested %d directories deep in %s, deeper than submodule names are followed, so a git directory in it could not be protected: remove it", filepath.Join(s.r.Host, sub), depth, filepath.Join(s.r.Host, modules)))
			continue
		}
		marked := s.marked(sub)
		if marked {
			s.refuse(s.addGitDir(sub))
		}
		if err := s.addModules(sub, depth+1, marked); err != nil {
			return err
		}
	}
	return nil
}

// gitOwn are the directories git makes in a git directory (modules and
// worktrees addGitDir looks into itself).
var gitOwn = map[string]bool{
	"objects": true, "refs": true, "logs": true, "info": true, "hooks": true, "branches": true,
	"remotes": true, "rr-cache": true, "svn": true, "lfs": true, "reftable": true,
	"modules": true, "worktrees": true,
}

// marked tells whether the directory rel holds one of gitMarks.
func (s *gitScan) marked(rel string) bool {
	for _, name := range gitMarks {
		if _, err := os.Lstat(filepath.Join(procPath(s.r.Dir), rel, name)); err == nil {
			return true
		}
	}
	return false
}

// gitEntry judges the .git entry of rel, whose type is typ (DT_*).
func (s *gitScan) gitEntry(rel string, typ uint8) error {
	dotGit := filepath.Join(rel, ".git")
	switch typ {
	case unix.DT_LNK:
		return fmt.Errorf("%s is a symlink: git follows it, and a symlink cannot be made read-only; replace it with the directory it points to, or remove it", filepath.Join(s.r.Host, dotGit))
	case unix.DT_DIR:
		return s.addGitDir(dotGit)
	case unix.DT_REG:
		data, err := readGitFile(s.r, dotGit)
		if errors.Is(err, unix.ENOENT) {
			return nil // gone since it was listed
		}
		if err != nil {
			// Unread, the git directory it names would go unprotected.
			return fmt.Errorf("%s cannot be read (%v), so the repository it names cannot be protected: make it a readable file, or remove it", filepath.Join(s.r.Host, dotGit), err)
		}
		g, err := gitFileDir(s.r, dotGit, data)
		if err != nil {
			return err
		}
		return s.follow(dotGit, data, g)
	}
	return nil
}

// follow adds g, the git directory the file at rel (a .git file or a
// commondir, read as data) names, to the scan or to elsewhere.
func (s *gitScan) follow(rel string, data []byte, g string) error {
	if s.w != nil {
		// A write to the file through another of its names (a link, an
		// fd opened by one) is an event of that name's directory only,
		// and a symlink on the way to g may be pointed elsewhere: the
		// claim reads and resolves it again.
		s.w.gitFiles = append(s.w.gitFiles, gitFile{root: s.r, rel: rel, data: data, dir: g})
	}
	shown := filepath.Join(s.r.Host, rel)
	switch {
	case g == "":
	case filepath.IsAbs(g):
		s.elsewhere = append(s.elsewhere, namedGitDir{g, shown})
	default:
		if s.namedBy[g] == "" {
			s.namedBy[g] = shown
		}
		return s.addGitDir(g)
	}
	return nil
}

// walk scans the root. It goes from each directory's fd to its entries
// (openat, fstatat), so no lookup resolves a path from the root again, and
// it takes the entries' types from getdents: 34-39 -> 26 ms for 4913
// leaves under 307 directories here (BenchmarkFindGitDirs), about a
// syscall a leaf. No lookup of a directory it lists follows a symlink.
func (s *gitScan) walk() error {
	err := s.visit(int(s.r.Dir.Fd()), ".", ".", 0)
	return errors.Join(err, s.drain())
}

// visit scans rel, the entry name of the directory parent.
func (s *gitScan) visit(parent int, name, rel string, depth int) error {
	s.visited++
	if s.visited > scanMaxDirs {
		return nil
	}
	// Only its .git is looked at in a leaf, and in a directory that
	// cannot be listed.
	onlyGit := func() error {
		dir, path := parent, filepath.Join(name, ".git")
		if s.w != nil {
			fd, err := unix.Openat(parent, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("watch %s: %w", filepath.Join(s.r.Host, rel), err)
			}
			defer unix.Close(fd)
			if err := s.w.dir(fd, s.r, rel); err != nil {
				return err
			}
			dir, path = fd, ".git"
		}
		var st unix.Stat_t
		if unix.Fstatat(dir, path, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			s.refuse(s.gitEntry(rel, direntType(st.Mode)))
		}
		return nil
	}
	if depth == scanDepth {
		return onlyGit()
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return onlyGit()
	}
	defer unix.Close(fd)
	if s.w != nil {
		if err := s.w.dir(fd, s.r, rel); err != nil {
			return err
		}
	}
	subdirs, gitType, err := readEntries(fd, s.buf)
	if err != nil {
		return onlyGit()
	}
	if gitType != unix.DT_UNKNOWN {
		s.refuse(s.gitEntry(rel, gitType))
	}
	for _, sub := range subdirs {
		subRel := filepath.Join(rel, sub)
		if sub != skipScanning && !boundReadOnly[subRel] {
			if err := s.visit(fd, sub, subRel, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// readEntries lists the directory open as fd: the names of its
// subdirectories but .git, sorted (the scan's order decides what
// scanMaxDirs leaves out), and the type of its .git entry (DT_UNKNOWN:
// none). An entry whose type getdents does not give is stat'ed.
func readEntries(fd int, buf []byte) (subdirs []string, gitType uint8, err error) {
	gitType = unix.DT_UNKNOWN
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err != nil {
			return nil, 0, err
		}
		if n <= 0 {
			break
		}
		for b := buf[:n]; len(b) >= direntNameOff; {
			// struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < direntNameOff || reclen > len(b) {
				return nil, 0, fmt.Errorf("getdents: a record of %d bytes", reclen)
			}
			typ, raw := b[18], b[direntNameOff:reclen]
			b = b[reclen:]
			end := bytes.IndexByte(raw, 0)
			if end < 0 {
				return nil, 0, fmt.Errorf("getdents: a name without its NUL")
			}
			name := string(raw[:end])
			if name == "." || name == ".." {
				continue
			}
			if typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
					continue
				}
				typ = direntType(st.Mode)
			}
			switch {
			case name == ".git":
				gitType = typ
			case typ == unix.DT_DIR:
				subdirs = append(subdirs, name)
			}
		}
	}
	slices.Sort(subdirs)
	return subdirs, gitType, nil
}

// direntNameOff is where a linux_dirent64's name begins.
const direntNameOff = 19

// direntType is the DT_* type of a stat mode (DT_UNKNOWN for none of
// those the scan tells apart).
func direntType(mode uint32) uint8 {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return unix.DT_DIR
	case unix.S_IFLNK:
		return unix.DT_LNK
	case unix.S_IFREG:
		return unix.DT_REG
	}
	return unix.DT_UNKNOWN
}

// gitFileDir is the git directory a .git file at rel in r names with data,
// as git reads it: relative to r when it is inside r, else as an absolute
// host path ("": data names none, and git would refuse the file).
func gitFileDir(r Root, rel string, data []byte) (string, error) {
	p, ok := gitPath(data, "gitdir: ")
	if !ok {
		return "", nil
	}
	return resolveGitPath(r, filepath.Dir(rel), p, filepath.Join(r.Host, rel))
}

// gitPath is the path a .git file (after prefix "gitdir: ") or a commondir
// file (prefix "") holds, read as git reads them: the whole content up to
// a NUL, less its trailing CRs and LFs, nothing else trimmed (a trailing
// blank, a second line are part of the path).
func gitPath(data []byte, prefix string) (string, bool) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		data = data[:i]
	}
	p, ok := bytes.CutPrefix(data, []byte(prefix))
	p = bytes.TrimRight(p, "\r\n")
	return string(p), ok && len(p) > 0
}

// resolveGitPath is where path p, relative to base in r (or absolute),
// leads git, as gitFileDir gives it. git follows the path's symlinks
// before its "..": where it leads now is the git directory git would use
// ("l/../gd" with l a symlink is not "gd"); only a path that leads nowhere
// yet is taken as written. A path through a magic link (/proc/self/cwd,
// /dev/fd/N) leads where it does in git's process, not in this one: it is
// refused. shown names the file that holds p, for the message.
func resolveGitPath(r Root, base, p, shown string) (string, error) {
	root, err := os.Readlink(procPath(r.Dir))
	if err != nil {
		return "", err
	}
	raw := p
	if !filepath.IsAbs(p) {
		raw = base + "/" + p
	}
	target := filepath.Join(root, raw)
	if filepath.IsAbs(p) {
		target = filepath.Clean(p)
	}
	fd, err := unix.Openat2(int(r.Dir.Fd()), raw, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_MAGICLINKS})
	switch {
	case err == nil:
		target, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		unix.Close(fd)
		if err != nil {
			return "", err
		}
	case errors.Is(err, unix.ELOOP):
		return "", fmt.Errorf("%s names %q, a path through a magic link or too many symlinks, which leads elsewhere for git than here: write the git directory's own path there", shown, p)
	}
	t, err := filepath.Rel(root, target)
	if err != nil || t == ".." || strings.HasPrefix(t, "../") {
		return target, nil // outside the root: another may hold it
	}
	return t, nil
}

// readGitFile reads what of the .git file at rel in r names its git
// directory: its first 4 KiB.
func readGitFile(r Root, rel string) ([]byte, error) {
	f, err := openRegular(r.Dir, rel)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4096))
}

// openRegular opens a regular file at rel beneath dir for reading, following
// no symlink.
func openRegular(dir *os.File, rel string) (*os.File, error) {
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", rel)
	}
	return f, nil
}

// The repository a workspace gets, as git init writes it (minus the sample
// hooks): the daemon writes these few files itself rather than run git on a
// directory a runtime has written to.
var (
	repoDirs  = []string{"objects", "objects/info", "objects/pack", "refs", "refs/heads", "refs/tags", "info"}
	repoFiles = []struct{ name, content string }{
		{"HEAD", "ref: refs/heads/main\n"},
		{"config", "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"},
		{"description", "Unnamed repository; edit this file 'description' to name the repository.\n"},
	}
)

// ensureRepository gives a workspace with no .git an empty repository,
// before the boundary exists: a hook or config planted in a repository the
// runtime made itself (git init, then .git/hooks/...) would run the next time
// anyone ran git there on the host, while this one is protected like any
// other. It is built in a temporary directory beside and renamed into place,
// so no half-made repository is ever seen.
func ensureRepository(r Root) (retErr error) {
	var st unix.Stat_t
	err := unix.Fstatat(int(r.Dir.Fd()), ".git", &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return nil // there is one (findGitDirs judges it), or the scan says why not
	}
	tmp := ".git.agentconnect-new"
	dirfd := int(r.Dir.Fd())
	removeTree(r.Dir, tmp) // a leftover of a crash
	if err := unix.Mkdirat(dirfd, tmp, 0o755); err != nil {
		return fmt.Errorf("create a repository in workspace %s: %w", r.Host, err)
	}
	defer func() {
		if retErr != nil {
			removeTree(r.Dir, tmp)
		}
	}()
	gfd, err := unix.Openat(dirfd, tmp, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("create a repository in workspace %s: %w", r.Host, err)
	}
	defer unix.Close(gfd)
	for _, d := range repoDirs {
		if err := unix.Mkdirat(gfd, d, 0o755); err != nil {
			return fmt.Errorf("create a repository in workspace %s: %w", r.Host, err)
		}
	}
	for _, f := range repoFiles {
		fd, err := unix.Openat(gfd, f.name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err == nil {
			_, err = unix.Write(fd, []byte(f.content))
			err = errors.Join(err, unix.Fsync(fd), unix.Close(fd))
		}
		if err != nil {
			return fmt.Errorf("create a repository in workspace %s: %s: %w", r.Host, f.name, err)
		}
	}
	if err := unix.Renameat2(dirfd, tmp, dirfd, ".git", unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			removeTree(r.Dir, tmp)
			return nil // made meanwhile by another session's start
		}
		return fmt.Errorf("create a repository in workspace %s: %w", r.Host, err)
	}
	// The rename is made durable through a readable fd (an O_PATH one
	// cannot be synced).
	if wfd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Fsync(wfd)
		unix.Close(wfd)
	}
	return nil
}

// removeTree removes the directory rel beneath dir and what is in it,
// following no symlink; used for what this package made itself.
func removeTree(dir *os.File, rel string) {
	fd, err := unix.Openat(int(dir.Fd()), rel, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(int(dir.Fd()), rel, 0)
		return
	}
	sub := os.NewFile(uintptr(fd), rel)
	names, _ := sub.Readdirnames(-1)
	for _, n := range names {
		removeTree(sub, n)
	}
	sub.Close()
	unix.Unlinkat(int(dir.Fd()), rel, unix.AT_REMOVEDIR)
}

// fsLocation is where a directory lies on its filesystem: the device and
// the path beneath the filesystem's root, the same through every mount
// that shows it (a bind mount is another path to it).
type fsLocation struct{ dev, path string }

// holds is g relative to l, when l holds it.
func (l fsLocation) holds(g fsLocation) (string, bool) {
	rel, err := filepath.Rel(l.path, g.path)
	if l.dev != g.dev || err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

// locate is the fsLocation of host path p (absolute, in this namespace); a
// path not there yet is located by its nearest parent that is.
func locate(mounts map[uint64]mount, p string) (fsLocation, error) {
	rest := ""
	for {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err == nil {
			defer unix.Close(fd)
			return locateFD(mounts, fd, rest)
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return fsLocation{}, fmt.Errorf("locate %s: %w", p, err)
		}
		rest, p = filepath.Join(filepath.Base(p), rest), filepath.Dir(p)
	}
}

// locateFD is the fsLocation of rest beneath the file open as fd.
func locateFD(mounts map[uint64]mount, fd int, rest string) (fsLocation, error) {
	m, err := mountOfFD(mounts, fd)
	if err != nil {
		return fsLocation{}, err
	}
	at, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fsLocation{}, err
	}
	within, err := filepath.Rel(m.point, at)
	if err != nil {
		return fsLocation{}, err
	}
	return fsLocation{m.dev, filepath.Join(m.root, within, rest)}, nil
}

// rootView is a root as paths are compared with it: where it lies on its
// filesystem, and its path in this namespace.
type rootView struct {
	loc fsLocation
	top string
}

func viewOf(mounts map[uint64]mount, dir *os.File) (rootView, error) {
	loc, err := locateFD(mounts, int(dir.Fd()), "")
	if err != nil {
		return rootView{}, err
	}
	top, err := os.Readlink(procPath(dir))
	return rootView{loc, top}, err
}

// shows is every path, relative to the root, where it shows location g:
// beneath the root's own location, and beneath each mount inside the root
// (another path to a directory, bound there on the host).
func (v rootView) shows(mounts map[uint64]mount, g fsLocation) []string {
	var at []string
	if rel, ok := v.loc.holds(g); ok {
		at = append(at, rel)
	}
	for _, m := range mounts {
		point, err := filepath.Rel(v.top, m.point)
		if err != nil || point == "." || point == ".." || strings.HasPrefix(point, "../") {
			continue
		}
		if rel, ok := (fsLocation{m.dev, m.root}).holds(g); ok && !slices.Contains(at, filepath.Join(point, rel)) {
			at = append(at, filepath.Join(point, rel))
		}
	}
	return at
}
