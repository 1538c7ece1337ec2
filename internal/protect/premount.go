package protect

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Premount makes the binds beneath each of roots (its protected names; not
// the root itself) on the host, in the calling thread's mount namespace,
// which must be a private one of its own, a slave of the host's (see
// NewMountNS): a boundary started from that thread then binds each root
// recursively and gets them with it. bwrap parses the whole mount table
// again for every bind it makes, ~300 µs each here, and a session has ~55
// of them; a bind of our own costs ~20 µs.
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
	root, err := unix.Open(r.Host, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("protect %s: %w", r.Host, err)
	}
	defer unix.Close(root)
	if err := sameObject(root, r.Host, r.Checks[0]); err != nil {
		return err
	}
	for _, c := range r.Checks[1:] {
		if err := premountOne(root, r.Host, c); err != nil {
			return err
		}
	}
	return nil
}

// premountOne binds c.Rel beneath root onto itself, read-only (when c says
// so), nosuid and nodev from the moment it appears: the bind is made
// detached from the object opened (open_tree), given its flags
// (mount_setattr), and attached onto that same object (move_mount), so
// that no path is looked up again between the check and the mount.
func premountOne(root int, host string, c Check) error {
	shown := host + "/" + c.Rel
	fd, err := unix.Openat2(root, c.Rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("protected path %s changed since the boundary was planned (%v): start the session again", shown, err)
	}
	defer unix.Close(fd)
	if err := sameObject(fd, shown, c); err != nil {
		return err
	}
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("bind %s: %w", shown, err)
	}
	defer unix.Close(tree)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if c.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("bind %s read-only: %w", shown, err)
	}
	if err := unix.MoveMount(tree, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: %w", shown, err)
	}
	return nil
}

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
