package microvm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Runner runs a host command to its end and returns its combined output.
// The shim passes one that runs it through its reaper: os/exec's own wait
// beside the shim's wait4(-1) loop could lose the command's exit status.
type Runner func(name string, args ...string) ([]byte, error)

// PrepareDisks makes the VM's writable disks in c.Dir when they do not
// exist yet: sparse files of DiskGiB each, formatted ext4 (lazily, so that a
// 10 GiB disk costs a few MiB until written) with mke2fs run by run. A VM
// whose disks exist keeps them: that is how VM-local files survive stop and
// resume. On error nothing half-made is left. It reports whether every
// disk is new: a guest that boots on them reads nothing of a session's.
func PrepareDisks(c Config, run Runner) (fresh bool, retErr error) {
	if c.DiskGiB < 1 {
		return false, fmt.Errorf("diskGiB %d: want at least 1", c.DiskGiB)
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return false, fmt.Errorf("VM directory: %w", err)
	}
	fresh = true
	for _, name := range []string{DiskUpper, DiskDocker} {
		path := filepath.Join(c.Dir, name+".img")
		if _, err := os.Stat(path); err == nil {
			fresh = false
			continue
		}
		if err := makeDisk(path, int64(c.DiskGiB)<<30, run); err != nil {
			return false, err
		}
	}
	return fresh, nil
}

// makeDisk writes an ext4 filesystem of size bytes to path, through a
// temporary file renamed at the end.
func makeDisk(path string, size int64, run Runner) (retErr error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("disk %s: %w", filepath.Base(path), err)
	}
	defer func() {
		if retErr != nil {
			os.Remove(tmp)
		}
	}()
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("disk %s: %w", filepath.Base(path), err)
	}
	f.Close()
	out, err := run("mke2fs", "-q", "-F", "-t", "ext4",
		"-E", "lazy_itable_init=1,lazy_journal_init=1", "-L", strings.TrimSuffix(filepath.Base(path), ".img"), tmp)
	if err != nil {
		return fmt.Errorf("format disk %s: %v: %s", filepath.Base(path), err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, path)
}
