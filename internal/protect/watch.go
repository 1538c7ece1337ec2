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
	fd     int             // inotify, non-blocking
	mounts []byte          // /proc/self/mountinfo when the watch began: a mount beneath a root is no event
	devs   map[uint64]bool // the devices of watched directories, each on a filesystem of watchedFS
	// gitFiles are the .git files the scan read, to be read again.
	gitFiles []gitFile
	// changed: the watch saw a change, or cannot vouch for the roots (a
	// git directory not there yet, a git directory the plan does not
	// protect).
	changed bool
}

// gitFile is a .git file as the watch's scan read it.
type gitFile struct {
	root Root
	rel  string
	data []byte
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
	w := &rootsWatch{fd: fd, mounts: mounts, devs: map[uint64]bool{}}
	defer func() {
		if retErr != nil {
			w.close()
		}
	}()
	protected := p.protected()
	for _, r := range p.roots {
		if r.Dir == nil {
			return fmt.Errorf("the plan of %s was released", r.Host)
		}
		dirs, err := scanGitDirs(r, w)
		if err != nil {
			return err
		}
		for _, g := range dirs {
			if !protected[filepath.Join(r.Host, g)] {
				w.changed = true // made since Prepare: stale already
			}
		}
	}
	p.watch = w
	return nil
}

// protected is the set of the plan's git directories.
func (p *Plan) protected() map[string]bool {
	m := map[string]bool{}
	for _, g := range p.GitDirs {
		m[g] = true
	}
	return m
}

// dir adds the directory open as fd to the watch.
func (w *rootsWatch) dir(fd int) error {
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
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && bytes.Equal(mounts, w.mounts)
}

// eventsMatter reports whether any of the inotify events in b could add a
// git directory: one about a directory entry, or a .git, or the watched
// directory itself (its mode, its removal or move), or a lost event. Others
// are about files, which the scan never looks into but for .git.
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
		if mask&lost != 0 || mask&unix.IN_ISDIR != 0 || string(name) == ".git" || len(name) == 0 {
			return true
		}
	}
	return len(b) != 0
}

func (w *rootsWatch) close() { unix.Close(w.fd) }
