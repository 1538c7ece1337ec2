// Package vmsnapshot keeps snapshots of booted microVMs in the daemon's home:
// a guest booted to its guest agent once per key (microvm.Config.SnapshotKey),
// saved, and restored by later sessions instead of booting. A snapshot is the
// guest's RAM (a sparse file: what the guest never touched is a hole) and
// QEMU's device state (the migration stream, without the RAM).
package vmsnapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Keep bounds the snapshots kept: each is the RAM a booted guest touched
// (~70 MiB at 512 MiB), and a new image or VM shape makes a new one; the
// least recently used go first.
const Keep = 4

// File names in a snapshot's directory.
const (
	stateFile = "state" // QEMU's device state
	ramFile   = "ram"   // the guest's RAM
)

// Store is the directory of snapshots, one directory each, named by key.
type Store struct{ Dir string }

// Snapshot is an open snapshot: both files opened from one directory, so
// that they belong together whatever replaces it meanwhile.
type Snapshot struct {
	Key        string
	State, RAM *os.File
}

// Close closes both files.
func (s *Snapshot) Close() {
	s.State.Close()
	s.RAM.Close()
}

// Open opens key's snapshot, or returns nil (and no error) when there is
// none. Its use is recorded, for Keep.
func (st Store) Open(key string) (*Snapshot, error) {
	st.prune() // what a crashed save left, too
	dir := filepath.Join(st.Dir, key)
	d, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", dir, err)
	}
	defer d.Close()
	open := func(name string) (*os.File, error) {
		fd, err := unix.Openat(int(d.Fd()), name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: open %s: %w", dir, name, err)
		}
		return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
	}
	state, err := open(stateFile)
	if err != nil {
		return nil, err
	}
	ram, err := open(ramFile)
	if err != nil {
		state.Close()
		return nil, err
	}
	now := time.Now()
	os.Chtimes(dir, now, now)
	return &Snapshot{Key: key, State: state, RAM: ram}, nil
}

// Save saves key's snapshot: writeState writes QEMU's device state to the
// file it is given, and ram is the guest's RAM, of which only the pages
// that hold something other than zeros are copied (copyNonZero). The
// snapshot appears whole or not at all; one saved meanwhile under the same
// key stays. Then the least recently used beyond Keep go.
func (st Store) Save(key string, writeState func(*os.File) error, ram *os.File) (retErr error) {
	if err := os.MkdirAll(st.Dir, 0o700); err != nil {
		return fmt.Errorf("save the VM snapshot: %w", err)
	}
	tmp, err := os.MkdirTemp(st.Dir, key+".tmp-")
	if err != nil {
		return fmt.Errorf("save the VM snapshot: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	write := func(name string, fill func(*os.File) error) error {
		f, err := os.OpenFile(filepath.Join(tmp, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = fill(f)
		if err == nil {
			// On disk before the rename: a crash leaves no short
			// snapshot, and no other fsync on the filesystem waits for
			// this data in the journal.
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("save the VM snapshot: %s: %w", name, err)
		}
		return nil
	}
	if err := write(stateFile, writeState); err != nil {
		return err
	}
	size, err := ram.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("save the VM snapshot: %w", err)
	}
	if err := write(ramFile, func(f *os.File) error { return copyNonZero(f, ram, size) }); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(st.Dir, key)); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			os.RemoveAll(tmp) // another VM's came first: as good
			return nil
		}
		return fmt.Errorf("save the VM snapshot: %w", err)
	}
	st.prune()
	return nil
}

// Remove removes key's snapshot (one that failed to restore): renamed aside
// first, so that no Open finds it half gone.
func (st Store) Remove(key string) error {
	dir := filepath.Join(st.Dir, key)
	aside, err := os.MkdirTemp(st.Dir, key+".rm-")
	if err != nil {
		return err
	}
	if err := os.Rename(dir, filepath.Join(aside, key)); err != nil {
		os.Remove(aside)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.RemoveAll(aside)
}

// prune removes the least recently used snapshots beyond Keep, and what a
// save or a removal cut short left (older than a minute: one may be
// running now).
func (st Store) prune() {
	entries, err := os.ReadDir(st.Dir)
	if err != nil {
		return
	}
	type snap struct {
		name string
		used time.Time
	}
	var snaps []snap
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.IsDir() {
			continue
		}
		if strings.Contains(e.Name(), ".tmp-") || strings.Contains(e.Name(), ".rm-") {
			if time.Since(fi.ModTime()) > time.Minute {
				os.RemoveAll(filepath.Join(st.Dir, e.Name()))
			}
			continue
		}
		snaps = append(snaps, snap{e.Name(), fi.ModTime()})
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].used.After(snaps[j].used) })
	for i := Keep; i < len(snaps); i++ {
		st.Remove(snaps[i].name)
	}
}

// page is the unit copyNonZero looks at: the guest's and the memfd's page.
const page = 4096

// zeroPage is a page of zeros to compare with.
var zeroPage [page]byte

// copyBuffer is how much of the guest's RAM copyNonZero reads at a time.
const copyBuffer = 1 << 20

// copyNonZero copies the first size bytes of src to dst at the same
// offsets, only the pages where src has data that is not all zeros: dst,
// size bytes long afterwards, has holes elsewhere, which read as the zeros
// they stand for. A booted guest's RAM holds many pages of zeros that are
// not holes (here 20 of the 89 MiB a snapshot held), and every clone
// copied them into its memfd and kept them for its life. Only src's data
// extents are read, so none of its holes is allocated, through a buffer
// mapped for the copy and unmapped after: nothing of it stays in the heap
// of the shim, which runs the VM on. (Reading through a mapping of src
// instead took 3-4 times as long here: a page fault a few pages.)
func copyNonZero(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	buf, err := unix.Mmap(-1, 0, copyBuffer, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src.Name(), err)
	}
	defer unix.Munmap(buf)
	zero := func(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }
	return eachExtent(src, size, func(data, hole int64) error {
		for base := data; base < hole; {
			n, err := unix.Pread(int(src.Fd()), buf[:min(copyBuffer, hole-base)], base)
			if err != nil {
				return fmt.Errorf("read %s: %w", src.Name(), err)
			}
			if n == 0 {
				return fmt.Errorf("read %s: it ends at %d, before %d", src.Name(), base, hole)
			}
			b := buf[:n]
			for off := 0; off < n; {
				for off < n && zero(b[off:min(off+page, n)]) {
					off += page
				}
				start := off
				for off < n && !zero(b[off:min(off+page, n)]) {
					off += page
				}
				off = min(off, n)
				for at := start; at < off; {
					w, err := unix.Pwrite(int(dst.Fd()), b[at:off], base+int64(at))
					if err != nil {
						return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
					}
					at += w
				}
			}
			base += int64(n)
		}
		return nil
	})
}

// eachExtent calls fn with each extent of data [data, hole) in the first
// size bytes of f, in order, and stops at fn's first error.
func eachExtent(f *os.File, size int64, fn func(data, hole int64) error) error {
	in := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole after off
		}
		if err != nil {
			return fmt.Errorf("find data in %s: %w", f.Name(), err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("find a hole in %s: %w", f.Name(), err)
		}
		hole = min(hole, size)
		if err := fn(data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// CopySparse copies the first size bytes of src to dst at the same offsets,
// only where src has data: dst, size bytes long afterwards, keeps holes
// where src has them. The kernel copies (sendfile): a buffer here would stay
// in the shim's heap for the VM's life.
func CopySparse(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	in, out := int(src.Fd()), int(dst.Fd())
	return eachExtent(src, size, func(data, hole int64) error {
		if _, err := unix.Seek(out, data, io.SeekStart); err != nil {
			return fmt.Errorf("copy to %s: %w", dst.Name(), err)
		}
		for off := data; off < hole; {
			n, err := unix.Sendfile(out, in, &off, int(min(hole-off, 1<<30)))
			if err != nil {
				return fmt.Errorf("copy %s to %s: %w", src.Name(), dst.Name(), err)
			}
			if n == 0 {
				return fmt.Errorf("copy %s to %s: it ends at %d, before %d", src.Name(), dst.Name(), off, hole)
			}
		}
		return nil
	})
}
