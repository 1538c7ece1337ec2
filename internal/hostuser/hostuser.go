// Package hostuser resolves the account host sessions run as under a root
// daemon (config sandbox.host.user), checks that it can reach the daemon's
// home, and hands the agent's own directories to it.
package hostuser

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// Lookup resolves name to its ids and groups. Root is refused: the setting
// exists so that runtimes do not run as root.
func Lookup(name string) (*session.RunAs, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox.host.user %s: no such account: create it (useradd --system --user-group %s) or remove the key", name, name)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("sandbox.host.user %s: uid %q or gid %q is not a number", name, u.Uid, u.Gid)
	}
	if uid == 0 {
		return nil, fmt.Errorf("sandbox.host.user %s is root (uid 0): name an unprivileged account", name)
	}
	r := &session.RunAs{Name: name, UID: uint32(uid), GID: uint32(gid)}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("sandbox.host.user %s: its groups: %w", name, err)
	}
	for _, id := range ids {
		if g, err := strconv.ParseUint(id, 10, 32); err == nil {
			r.Groups = append(r.Groups, uint32(g))
		}
	}
	return r, nil
}

// Check says why host sessions cannot run as the account name on this
// daemon (euid the daemon's, home its home), or "". A daemon that runs as
// the account already has nothing to switch.
func Check(name string, euid int, home string) string {
	r, err := Lookup(name)
	if err != nil {
		return err.Error()
	}
	if euid == int(r.UID) {
		return ""
	}
	if euid != 0 {
		return fmt.Sprintf("sandbox.host.user %s: only a root daemon can run runtimes as another account, and this one runs as uid %d: run it as root, or remove the key", name, euid)
	}
	if home == "" {
		return ""
	}
	if err := reachable(filepath.Dir(home), r); err != nil {
		return fmt.Sprintf("sandbox.host.user %s cannot reach the daemon's home %s: %v: give others the search bit (chmod o+x), or use a home outside it (--home /var/lib/agentconnect)", name, home, err)
	}
	return ""
}

// reachable checks that r may search dir and every directory above it,
// by their modes (owner, group, others; ACLs are not read).
func reachable(dir string, r *session.RunAs) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if !searchable(fi.Mode().Perm(), st.Uid, st.Gid, r) {
			return fmt.Errorf("%s is %04o, owned by uid %d", d, fi.Mode().Perm(), st.Uid)
		}
		if d == "/" {
			return nil
		}
	}
}

func searchable(mode fs.FileMode, uid, gid uint32, r *session.RunAs) bool {
	switch {
	case uid == r.UID:
		return mode&0o100 != 0
	case gid == r.GID || contains(r.Groups, gid):
		return mode&0o010 != 0
	}
	return mode&0o001 != 0
}

func contains(ids []uint32, id uint32) bool {
	for _, g := range ids {
		if g == id {
			return true
		}
	}
	return false
}

// OpenPath gives others the search bit on each of dirs (the daemon's home,
// its agents directory, one agent's directory), so that r reaches its own
// directories inside by name; nothing becomes readable or listable.
func OpenPath(dirs ...string) error {
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
	}
	return nil
}

// Own gives dir and everything under it to r, unless dir is r's already
// (it was handed over before). Links are changed, never followed: what a
// runtime left there cannot redirect the change.
func Own(dir string, r *session.RunAs) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid == r.UID && st.Gid == r.GID {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		return os.Lchown(p, int(r.UID), int(r.GID))
	})
}
