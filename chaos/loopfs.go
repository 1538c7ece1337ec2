package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// loopFS is a small ext4 filesystem in a file, mounted through a loop
// device, so that the home's disk can be filled without filling the
// machine's.
type loopFS struct {
	img, mnt string
	mib      int
	filler   string // the file that fills it, while it is full
}

// makeLoopFS makes and mounts a mib MiB ext4 filesystem under dir. No
// blocks are reserved for root: the daemon is root, and the fill must reach
// it.
func makeLoopFS(dir string, mib int) (*loopFS, error) {
	l := &loopFS{img: filepath.Join(dir, "home.img"), mnt: filepath.Join(dir, "mnt"), mib: mib}
	f, err := os.Create(l.img)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(int64(mib) << 20)
	f.Close()
	if err != nil {
		return nil, err
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", l.img).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mkfs.ext4 %s: %v: %s (e2fsprogs)", l.img, err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(l.mnt, 0o755); err != nil {
		return nil, err
	}
	if out, err := exec.Command("mount", "-o", "loop", l.img, l.mnt).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mount -o loop %s: %v: %s", l.img, err, strings.TrimSpace(string(out)))
	}
	return l, nil
}

// fill writes a file until the filesystem says ENOSPC, and returns how much
// it wrote.
func (l *loopFS) fill() (int64, error) {
	l.filler = filepath.Join(l.mnt, "filler")
	f, err := os.OpenFile(l.filler, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(l.mnt, &st); err != nil {
		return 0, err
	}
	// Most of it at once, then what is left a block at a time.
	n := int64(st.Bavail) * st.Bsize
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, n); err != nil && !errors.Is(err, syscall.ENOSPC) {
		return 0, fmt.Errorf("fallocate %s: %w", l.filler, err)
	}
	if _, err := f.Seek(0, 2); err != nil {
		return 0, err
	}
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			return 0, fmt.Errorf("fill %s: %w", l.filler, err)
		}
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// free removes the filler.
func (l *loopFS) free() error {
	if l.filler == "" {
		return nil
	}
	err := os.Remove(l.filler)
	l.filler = ""
	syscall.Sync()
	return err
}

// remove unmounts the filesystem (a few tries: a process that just exited
// may still hold it for a moment) and removes its file.
func (l *loopFS) remove() error {
	var out []byte
	var err error
	for i := 0; i < 50; i++ {
		if out, err = exec.Command("umount", l.mnt).CombinedOutput(); err == nil {
			return os.Remove(l.img)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("umount %s: %v: %s", l.mnt, err, strings.TrimSpace(string(out)))
}
