package protect

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Premount makes the binds beneath each of roots (its protected names; not
// the root itself) on the host, in the calling thread's mount namespace,
// which must be a private one of its own, a slave of the host's (see
// NewMountNS): a boundary started from that thread then binds each root
// recursively and gets them with it (a VM share's virtiofsd; srt's sandbox
// keeps bwrap's binds, see docs/design-notes.md). bwrap parses the whole
// mount table again for every bind it makes, ~300 µs each here, and a
// writable root has ~15 protected names; a bind of our own costs ~20 µs.
//
// Each name is opened again beneath its root, in this namespace, without
// following a symlink, and must be the object the plan opened: a swap since
// Prepare fails the start, as Verify would inside. Read-only binds are
// read-only, and all are nosuid and nodev, as bwrap would make them (so it
// has nothing to remount). It reads only the roots' hosts and checks, not
// the binds' fds, which the boundary may have closed by then.
func Premount(roots []RootPlan) error {
	for _, r := range roots {
		if len(r.Binds) < 2 {
			continue
		}
		if err := premountRoot(r); err != nil {
			return err
		}
	}
	return nil
}

func premountRoot(r RootPlan) error {
	root, err := os.OpenFile(r.Host, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("protect %s: %w", r.Host, err)
	}
	defer root.Close()
	if err := sameObject(int(root.Fd()), r.Host, r.Checks[0]); err != nil {
		return err
	}
	for _, c := range r.Checks[1:] {
		if err := premountOne(root, r.Host, c); err != nil {
			return err
		}
	}
	return nil
}

// premountOne binds c.Rel beneath root onto itself, then makes the bind
// read-only (when c says so), nosuid and nodev. Two calls of mount(2), of
// which only the bind takes the kernel's global namespace lock for writing
// (the remount changes flags under the mount hash's lock): with hundreds of
// sessions starting at once that lock is what they wait for, and
// open_tree, mount_setattr and move_mount took it three times a name.
// The remount finds the bind by opening the name again: a name swapped in
// between gets the flags, or fails, and Verify inside refuses the start.
func premountOne(root *os.File, host string, c Check) error {
	shown := host + "/" + c.Rel
	f, err := openBeneath(root, c.Rel)
	if err != nil {
		return fmt.Errorf("protected path %s changed since the boundary was planned (%v): start the session again", shown, err)
	}
	err = sameObject(int(f.Fd()), shown, c)
	if err == nil {
		err = unix.Mount(fdPath(f), fdPath(f), "", unix.MS_BIND, "")
	}
	f.Close()
	if err != nil {
		return fmt.Errorf("bind %s: %w", shown, err)
	}
	// Opened again, the name is the bind's root, whose flags are the
	// bind's own.
	if f, err = openBeneath(root, c.Rel); err != nil {
		return fmt.Errorf("bind %s read-only: %w", shown, err)
	}
	defer f.Close()
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if c.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", fdPath(f), "", flags, ""); err != nil {
		return fmt.Errorf("bind %s read-only: %w", shown, err)
	}
	return nil
}

// fdPath is f's path for mount(2), through the calling thread's /proc (its
// mount namespace is its own).
func fdPath(f *os.File) string { return "/proc/thread-self/fd/" + strconv.Itoa(int(f.Fd())) }

// sameObject checks that fd is the object c was planned for.
func sameObject(fd int, shown string, c Check) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("protected path %s: %w", shown, err)
	}
	if st.Dev != c.Dev || st.Ino != c.Ino {
		return fmt.Errorf("protected path %s is not what the boundary planned to bind there: it changed meanwhile; start the session again", shown)
	}
	return nil
}

// NewMountNS gives the calling thread a mount namespace of its own, a slave
// of the host's (so that nothing mounted in it reaches the host, and the
// host's unmounts reach it). The caller has locked the thread
// (runtime.LockOSThread) and never unlocks it: the thread ends with its
// goroutine, and the namespace with the last process in it. It needs
// CAP_SYS_ADMIN (see CanPremount).
func NewMountNS() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("new mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("new mount namespace: make / a slave: %w", err)
	}
	return nil
}

// CanPremount reports whether this process may make mount namespaces of
// its own (CAP_SYS_ADMIN in its effective set): a daemon run as root. A
// daemon run as another user leaves the binds to bwrap.
func CanPremount() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_ADMIN) != 0
}
