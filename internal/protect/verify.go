package protect

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
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
