package protect

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/mountinfo"
)

// Verify checks, inside a boundary once its mounts are in, that every bind
// of the plan landed where it should: the object at each path is the one
// that was opened on the host, reached without a symlink beneath its root,
// and a read-only bind is read-only. bwrap (like mount(2)) follows symlinks
// in a destination, so a component swapped between Prepare and the mount
// would put the bind somewhere else and leave the real name writable; this
// is what stops such a start.
func Verify(checks []Check) error {
	roots := map[string]int{}
	defer func() {
		for _, fd := range roots {
			unix.Close(fd)
		}
	}()
	mounts, err := readMounts()
	if err != nil {
		return err
	}
	mc := &mountCheck{mounts: mounts, parents: map[string]fsLocation{}}
	for _, c := range checks {
		rfd, ok := roots[c.Root]
		if !ok {
			// The way to a root is the boundary's own (a read-only view or
			// its tmpfs), so it may follow symlinks; beneath it, nothing may.
			fd, err := unix.Open(c.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("protected root %s: %w", c.Root, err)
			}
			roots[c.Root] = fd
			rfd = fd
		}
		fd := rfd
		if c.Rel != "." {
			var err error
			fd, err = unix.Openat2(rfd, c.Rel, &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
			})
			if err != nil {
				return fmt.Errorf("protected path %s/%s changed while the boundary was set up (%v): start the session again", c.Root, c.Rel, err)
			}
		}
		err := checkOne(fd, c)
		if err == nil && fd != rfd {
			err = mc.check(rfd, fd, c)
		}
		if fd != rfd {
			unix.Close(fd)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func checkOne(fd int, c Check) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("protected path %s/%s: %w", c.Root, c.Rel, err)
	}
	if st.Dev != c.Dev || st.Ino != c.Ino {
		return fmt.Errorf("protected path %s/%s is not what was bound there: it changed while the boundary was set up; start the session again", c.Root, c.Rel)
	}
	if !c.ReadOnly {
		return nil
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return fmt.Errorf("protected path %s/%s: %w", c.Root, c.Rel, err)
	}
	if fs.Flags&unix.ST_RDONLY == 0 {
		return fmt.Errorf("protected path %s/%s is writable inside the boundary", c.Root, c.Rel)
	}
	return nil
}

// Checks is every check of the plan, root by root.
func (p *Plan) Checks() []Check {
	var all []Check
	for _, r := range p.Roots {
		all = append(all, r.Checks...)
	}
	return all
}

// ChecksFile writes checks to an anonymous file (a memfd), rewound, for a
// boundary to read with ReadChecks.
func ChecksFile(checks []Check) (*os.File, error) {
	fd, err := unix.MemfdCreate("agentconnect-protected", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("protected paths: %w", err)
	}
	f := os.NewFile(uintptr(fd), "protected-checks")
	if err := json.NewEncoder(f).Encode(checks); err != nil {
		f.Close()
		return nil, fmt.Errorf("protected paths: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("protected paths: %w", err)
	}
	return f, nil
}

// maxChecks bounds what a boundary reads: about 200 bytes a check.
const maxChecks = 8 << 20

// ReadChecks reads the checks from fd, inside the boundary.
func ReadChecks(fd int) ([]Check, error) {
	f := os.NewFile(uintptr(fd), "protected-checks")
	defer f.Close()
	var checks []Check
	if err := json.NewDecoder(io.LimitReader(f, maxChecks)).Decode(&checks); err != nil {
		return nil, fmt.Errorf("read the protected paths: %w", err)
	}
	return checks, nil
}

// mount is a line of mountinfo: the device, the root (the path of what is
// mounted, within its filesystem) and the mount point.
type mount struct{ dev, root, point string }

// readMounts reads /proc/self/mountinfo, by mount ID.
func readMounts() (map[uint64]mount, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	m := map[uint64]mount{}
	for _, line := range strings.Split(string(data), "\n") {
		// ID PARENT MAJOR:MINOR ROOT MOUNTPOINT ..., split at blanks
		// only: the kernel escapes blank, tab, newline and backslash, and
		// any other byte (a no-break space, a \r) is the name's.
		f := strings.Split(line, " ")
		if len(f) < 5 {
			continue
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		m[id] = mount{dev: f[2], root: mountinfo.Unescape(f[3]), point: mountinfo.Unescape(f[4])}
	}
	return m, nil
}

// mountCheck is the state of check for one Verify: mountinfo, and the
// parents looked up so far (by root and directory).
type mountCheck struct {
	mounts  map[uint64]mount
	parents map[string]fsLocation
}

// check checks that c's bind, open as fd, is a mount of the
// directory its parent shows at its name: a parent renamed between the
// plan and the mounts (allowed, though a mount is beneath it) and made
// anew leaves every object the same, while the bind shows the old
// directory at the new path and the real one, at the parent's new name, is
// unprotected.
func (v *mountCheck) check(rootFD, fd int, c Check) error {
	bm, err := mountOfFD(v.mounts, fd)
	if err != nil {
		return err
	}
	// Most binds share a parent (the root, a .git): each is looked up once.
	key := c.Root + "\x00" + filepath.Dir(c.Rel)
	pp, ok := v.parents[key]
	if !ok {
		if pp, err = v.parent(rootFD, c); err != nil {
			return err
		}
		v.parents[key] = pp
	}
	if bm.dev != pp.dev {
		return nil // another filesystem: its paths are its own
	}
	if want := filepath.Join(pp.path, filepath.Base(c.Rel)); bm.root != want {
		return fmt.Errorf("protected path %s/%s is bound from %s, not from %s: a directory on its way was renamed while the boundary was set up; start the session again", c.Root, c.Rel, bm.root, want)
	}
	return nil
}

// parent locates the directory c's bind is in.
func (v *mountCheck) parent(rootFD int, c Check) (fsLocation, error) {
	fd, err := unix.Openat2(rootFD, filepath.Dir(c.Rel), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fsLocation{}, fmt.Errorf("protected path %s/%s changed while the boundary was set up (%v): start the session again", c.Root, c.Rel, err)
	}
	defer unix.Close(fd)
	return locateFD(v.mounts, fd, "")
}

// mountOfFD is the mountinfo line of the mount fd is on.
func mountOfFD(mounts map[uint64]mount, fd int) (mount, error) {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx); err != nil {
		return mount{}, fmt.Errorf("statx: %w", err)
	}
	m, ok := mounts[stx.Mnt_id]
	if !ok {
		return mount{}, fmt.Errorf("mount %d is not in mountinfo", stx.Mnt_id)
	}
	return m, nil
}
