// Package fileid tells one version of a file from another at the same path,
// by stat alone: the spare shims' binary (an upgrade replaces it) and the
// guest image files a kept helper answer was read from.
package fileid

import (
	"os"
	"syscall"
)

// ID is one version of a file: its device, inode, size and change times.
// A file that is replaced, rewritten or touched has another (a rewrite of
// the same size within one tick of the kernel's file clock is the
// exception, as for every stat-based cache).
type ID struct {
	Path  string `json:"path"`
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime"` // ns
	Ctime int64  `json:"ctime"` // ns
}

// Of is path's ID now.
func Of(path string) (ID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return ID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return ID{Path: path, Dev: st.Dev, Ino: st.Ino, Size: st.Size,
		Mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec, Ctime: st.Ctim.Sec*1e9 + st.Ctim.Nsec}, nil
}

// All is the ID of each of paths, or the first error.
func All(paths []string) ([]ID, error) {
	ids := make([]ID, len(paths))
	for i, p := range paths {
		id, err := Of(p)
		if err != nil {
			return nil, err
		}
		ids[i] = id
	}
	return ids, nil
}

// Unchanged reports whether every file of ids is still that version.
func Unchanged(ids ...ID) bool {
	for _, id := range ids {
		if now, err := Of(id.Path); err != nil || now != id {
			return false
		}
	}
	return true
}
