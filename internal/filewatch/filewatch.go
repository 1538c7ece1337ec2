// Package filewatch wakes a reader when a file it follows is written to, or
// replaced by a rename (inotify): the session output log and the violations
// file are followed this way, at no cost while nothing is written.
//
// Every watcher of the process shares one inotify instance: the kernel
// allows a user 128 of them by default (fs.inotify.max_user_instances),
// which a daemon with hundreds of sessions would run out of, and a watch
// is cheap (max_user_watches is in the hundred thousands).
package filewatch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watcher wakes a follower when its file is written to.
type Watcher struct {
	// C receives a value after each batch of writes. It holds at most one:
	// a follower reads the file to its end after each wakeup.
	C    chan struct{}
	wd   int
	name string // with WatchReplaced: the file's name in the watched directory
}

// Watch starts watching path. Set the watch up before the first read, so no
// write between that read and the first wait is missed.
func Watch(path string) (*Watcher, error) {
	return shared.add(path, unix.IN_MODIFY|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF, "")
}

// WatchReplaced wakes its follower each time a file is renamed to path, as
// an atomic rewrite does (a watch on the file itself would stay on the
// replaced inode). path's directory must exist; the file need not.
func WatchReplaced(path string) (*Watcher, error) {
	return shared.add(filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_ONLYDIR, filepath.Base(path))
}

// Close stops the watcher.
func (w *Watcher) Close() error {
	shared.remove(w)
	return nil
}

// hub is the process's inotify instance and who follows each of its
// watches. Watches of the same inode share a descriptor (inotify gives the
// same one), with the union of their masks.
type hub struct {
	mu       sync.Mutex
	fd       int // -1 until the first watch
	watchers map[int][]*Watcher
}

var shared = &hub{fd: -1, watchers: map[int][]*Watcher{}}

func (h *hub) add(path string, mask uint32, name string) (*Watcher, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		// Read by a goroutine of its own (through Go's poller): the
		// instance lives as long as the process.
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
		if err != nil {
			return nil, fmt.Errorf("watch %s: inotify: %w", path, err)
		}
		h.fd = fd
		go h.loop(fd)
	}
	wd, err := unix.InotifyAddWatch(h.fd, path, mask|unix.IN_MASK_ADD)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w := &Watcher{C: make(chan struct{}, 1), wd: wd, name: name}
	h.watchers[wd] = append(h.watchers[wd], w)
	return w, nil
}

func (h *hub) remove(w *Watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	list := h.watchers[w.wd]
	for i, o := range list {
		if o == w {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) > 0 {
		h.watchers[w.wd] = list
		return
	}
	delete(h.watchers, w.wd)
	// Gone already when the object was (IN_IGNORED): the error says so.
	unix.InotifyRmWatch(h.fd, uint32(w.wd))
}

// loop wakes, after each batch of events, the watchers the batch is about:
// those of each event's descriptor, and with a name only for events about
// that name.
func (h *hub) loop(fd int) {
	f := os.NewFile(uintptr(fd), "inotify")
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		wake := map[*Watcher]bool{}
		h.mu.Lock()
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
			end := unix.SizeofInotifyEvent + int(ev.Len)
			if end > len(b) {
				break
			}
			// The name is NUL-padded.
			name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:end], "\x00"))
			for _, w := range h.watchers[int(ev.Wd)] {
				if w.name == "" || w.name == name {
					wake[w] = true
				}
			}
			if ev.Mask&unix.IN_IGNORED != 0 {
				// The watched object is gone, and so is the descriptor:
				// the kernel may give its number to a new watch.
				delete(h.watchers, int(ev.Wd))
			}
			b = b[end:]
		}
		h.mu.Unlock()
		for w := range wake {
			select {
			case w.C <- struct{}{}:
			default:
			}
		}
	}
}
