// Package filewatch wakes a reader when a file it follows is written to, or
// replaced by a rename (inotify): the session output log and the violations
// file are followed this way, at no cost while nothing is written.
package filewatch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher wakes a follower when its file is written to.
type Watcher struct {
	f *os.File
	// C receives a value after each batch of writes. It holds at most one:
	// a follower reads the file to its end after each wakeup.
	C    chan struct{}
	done chan struct{}
}

// Watch starts watching path. Set the watch up before the first read, so no
// write between that read and the first wait is missed.
func Watch(path string) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch %s: inotify: %w", path, err)
	}
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w := &Watcher{f: os.NewFile(uintptr(fd), "inotify"), C: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop("")
	return w, nil
}

// WatchReplaced wakes its follower each time a file is renamed to path, as
// an atomic rewrite does (a watch on the file itself would stay on the
// replaced inode). path's directory must exist; the file need not.
func WatchReplaced(path string) (*Watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("watch %s: inotify: %w", path, err)
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w := &Watcher{f: os.NewFile(uintptr(fd), "inotify"), C: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop(filepath.Base(path))
	return w, nil
}

// loop wakes the follower after each batch of events; with name set, only
// for batches with an event about that name.
func (w *Watcher) loop(name string) {
	defer close(w.done)
	buf := make([]byte, 4096)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return // closed
		}
		if name != "" && !names(buf[:n], name) {
			continue
		}
		select {
		case w.C <- struct{}{}:
		default:
		}
	}
}

// names reports whether a batch of inotify events has one about name.
func names(buf []byte, name string) bool {
	for len(buf) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			return false
		}
		// The name is NUL-padded.
		if string(bytes.TrimRight(buf[unix.SizeofInotifyEvent:end], "\x00")) == name {
			return true
		}
		buf = buf[end:]
	}
	return false
}

// Close stops the watcher.
func (w *Watcher) Close() error {
	err := w.f.Close()
	<-w.done
	return err
}
