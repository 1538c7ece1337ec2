// Package filewatch wakes a reader when a file it follows is written to
// (inotify): the session output and violation logs are followed this way, at
// no cost while nothing is written.
package filewatch

import (
	"fmt"
	"os"

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
	go w.loop()
	return w, nil
}

func (w *Watcher) loop() {
	defer close(w.done)
	buf := make([]byte, 4096)
	for {
		if _, err := w.f.Read(buf); err != nil {
			return // closed
		}
		select {
		case w.C <- struct{}{}:
		default:
		}
	}
}

// Close stops the watcher.
func (w *Watcher) Close() error {
	err := w.f.Close()
	<-w.done
	return err
}
