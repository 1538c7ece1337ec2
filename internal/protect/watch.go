package protect

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// watchMask is what a change to a scanned directory can be: an entry made,
// removed, renamed, written or changed, or the directory itself gone.
// (IN_Q_OVERFLOW, IN_IGNORED and IN_UNMOUNT come unasked.)
const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// watchedFS are the filesystems whose every change inotify reports: local
// ones. On a network or FUSE filesystem another host or process changes
// what inotify never hears of, and an overlay's lower layers change beneath
// it; their roots are scanned at each claim.
var watchedFS = map[int64]string{
	unix.EXT4_SUPER_MAGIC:  "ext4",
	unix.XFS_SUPER_MAGIC:   "xfs",
	unix.BTRFS_SUPER_MAGIC: "btrfs",
	unix.TMPFS_MAGIC:       "tmpfs",
}

// rootsWatch follows the directories a scan of the roots looked into, from
// before it read each: any change that could add a git directory since is
// an event in its inotify queue.
type rootsWatch struct {
	fd        int             // inotify, non-blocking
	mountinfo []byte          // /proc/self/mountinfo when the watch began: a mount beneath a root is no event
	devs      map[uint64]bool // the devices of watched directories, each on a filesystem of watchedFS
	// gitFiles are the .git files the scan read, to be read again.
	gitFiles []gitFile
	// mountRoots are the watched directories that are the root of a mount
	// (the first the walk met on it, but for each root's own), to be
	// looked at again: a mount replaced by one of another directory at the
	// same place makes no event, and mountinfo may read the same (mount
	// IDs are reused).
	mountRoots []mountRoot
	mounts     map[uint64]bool // the mounts (unique IDs) of watched directories
	// changed: the watch saw a change, or cannot vouch for the roots (a
	// git directory not there yet, a git directory the plan does not
	// protect).
	changed bool
}

// mountRoot is a directory at rel in root that was the root of mount mnt,
// as the watch's scan saw it.
type mountRoot struct {
	root     Root
	rel      string
	dev, ino uint64
	mnt      uint64
}

// gitFile is a .git file or a commondir as the watch's scan read it, and
// where it led then (gitFileDir's answer).
type gitFile struct {
	root Root
	rel  string
	data []byte
	dir  string
}

// Watch follows the plan's roots from now on, so that Stale, the check of
// a warm boundary at its claim, reads what changed in them instead of
// scanning them again (~5 us a directory, a large workspace's 5000 ~26 ms
// on a claim's way here). It scans the roots once more, watching each
// directory before it reads it, and holds an inotify instance until Stale
// or Release. On an error nothing is watched and Stale scans: an inotify
// limit reached (fs.inotify.max_user_instances, max_user_watches), or a
// root on a filesystem whose changes inotify does not see.
func (p *Plan) Watch() (retErr error) {
	if p.watch != nil {
		return errors.New("the roots are watched already")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	w := &rootsWatch{fd: fd, mountinfo: mounts, devs: map[uint64]bool{}, mounts: map[uint64]bool{}}
	defer func() {
		if retErr != nil {
			w.close()
		}
	}()
	if p.released {
		return errors.New("the plan was released")
	}
	for _, r := range p.roots {
		// Each root's own mount is held by its fd.
		mnt, _, _, err := mountOf(int(r.Dir.Fd()))
		if err != nil {
			return err
		}
		w.mounts[mnt] = true
	}
	found, errs := scanRoots(p.roots, w)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, dirs := range found {
		for _, g := range dirs {
			if !p.protects(p.roots[i], g) {
				w.changed = true // made since Prepare: stale already
			}
		}
	}
	p.watch = w
	return nil
}

// protects reports whether the git directory at rel in r is one the plan
// protected: at its path, and the same directory (one made anew at that
// path, the old one renamed away, is not).
func (p *Plan) protects(r Root, rel string) bool {
	id, ok := p.gitDirIDs[filepath.Join(r.Host, rel)]
	var st unix.Stat_t
	return ok && unix.Fstatat(int(r.Dir.Fd()), rel, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && (fileID{st.Dev, st.Ino}) == id
}

// mountOf is the unique ID of the mount the file open as fd is on, and
// its device and inode.
func mountOf(fd int) (mnt, dev, ino uint64, err error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return 0, 0, 0, fmt.Errorf("statx: %w", err)
	}
	if stx.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
		return 0, 0, 0, errors.New("the kernel gives no unique mount IDs (statx STATX_MNT_ID_UNIQUE, Linux 6.8)")
	}
	return stx.Mnt_id, unix.Mkdev(stx.Dev_major, stx.Dev_minor), stx.Ino, nil
}

// dir adds the directory open as fd, at rel in r, to the watch.
func (w *rootsWatch) dir(fd int, r Root, rel string) error {
	mnt, dev, ino, err := mountOf(fd)
	if err != nil {
		return err
	}
	if !w.mounts[mnt] {
		w.mounts[mnt] = true
		w.mountRoots = append(w.mountRoots, mountRoot{root: r, rel: rel, dev: dev, ino: ino, mnt: mnt})
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if !w.devs[st.Dev] {
		var fs unix.Statfs_t
		if err := unix.Fstatfs(fd, &fs); err != nil {
			return err
		}
		if _, ok := watchedFS[fs.Type]; !ok {
			path, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
			return fmt.Errorf("%s is on a filesystem (type %#x) whose changes inotify may not see", path, fs.Type)
		}
		w.devs[st.Dev] = true
	}
	if _, err := unix.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask); err != nil {
		return fmt.Errorf("inotify watch: %w", err)
	}
	return nil
}

// unchanged reports whether nothing that could add a git directory
// happened in the watched directories, nor to the mounts, since the watch
// began, and every .git file reads as it did.
func (w *rootsWatch) unchanged() bool {
	buf := make([]byte, 64<<10)
	for !w.changed {
		n, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil || n <= 0 {
			return false
		}
		w.changed = eventsMatter(buf[:n])
	}
	if w.changed {
		return false
	}
	for _, g := range w.gitFiles {
		if data, err := readGitFile(g.root, g.rel); err != nil || !bytes.Equal(data, g.data) {
			return false
		}
		if g.leadsElsewhere() {
			return false
		}
	}
	for _, m := range w.mountRoots {
		f, err := openBeneath(m.root.Dir, m.rel)
		if err != nil {
			return false
		}
		mnt, dev, ino, err := mountOf(int(f.Fd()))
		f.Close()
		if err != nil || mnt != m.mnt || dev != m.dev || ino != m.ino {
			return false
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && bytes.Equal(mounts, w.mountinfo)
}

// leadsElsewhere reports whether g's path leads elsewhere now (a symlink
// on its way pointed at another directory), or cannot be resolved.
func (g gitFile) leadsElsewhere() bool {
	base, prefix := filepath.Dir(g.rel), "gitdir: "
	if filepath.Base(g.rel) == "commondir" {
		prefix = ""
	}
	p, ok := gitPath(g.data, prefix)
	if !ok {
		return g.dir != ""
	}
	dir, err := resolveGitPath(g.root, base, p, "")
	return err != nil || dir != g.dir
}

// gitNames are the entry names whose every change matters, whatever they
// are: a .git, and a git directory's modules and worktrees (a symlink of
// that name is listed through) and commondir; HEAD, which makes a
// directory in modules a git directory (gitMarks).
var gitNames = map[string]bool{".git": true, "modules": true, "worktrees": true, "commondir": true, "HEAD": true}

// eventsMatter reports whether any of the inotify events in b could add a
// git directory: one about a directory entry, or one of gitNames, or the
// watched directory itself (its mode, its removal or move), or a lost
// event. Others are about files, which the scan never looks into but for
// .git.
func eventsMatter(b []byte) bool {
	const lost = unix.IN_Q_OVERFLOW | unix.IN_IGNORED | unix.IN_UNMOUNT | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	for len(b) >= unix.SizeofInotifyEvent {
		// struct inotify_event: wd (4), mask (4), cookie (4), len (4), name.
		mask := binary.NativeEndian.Uint32(b[4:8])
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:16]))
		if end > len(b) {
			return true
		}
		name, _, _ := bytes.Cut(b[unix.SizeofInotifyEvent:end], []byte{0})
		b = b[end:]
		if mask&lost != 0 || mask&unix.IN_ISDIR != 0 || len(name) == 0 || gitNames[string(name)] {
			return true
		}
	}
	return len(b) != 0
}

func (w *rootsWatch) close() { unix.Close(w.fd) }
