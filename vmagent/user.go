package vmagent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// userPattern is the user names Exec takes (useradd's default rule): they
// are written into the account files as they are.
var userPattern = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// accountsMu serializes the account files' check-and-add: two Execs of one
// boot must not both append the runtime user.
var accountsMu sync.Mutex

// runtimeUser is the credential of user name, which must have uid: its
// primary gid from passwd, and every group of group that lists it as a
// member (docker, for the runtime user). The default image makes the user
// (scripts/build-image.sh); an image without it (a custom one) gets it
// added to the guest's writable layer, with the docker group when the image
// has one, so that the runtime never runs as root for want of an account.
// An image where the name or the uid belongs to something else is refused:
// the shares are mapped for uid (microvm.ShareIDMap).
func runtimeUser(etc, name string, uid uint32) (*syscall.Credential, error) {
	accountsMu.Lock()
	defer accountsMu.Unlock()
	passwd, group := filepath.Join(etc, "passwd"), filepath.Join(etc, "group")
	cred, owner, err := findUser(passwd, name, uid)
	if err != nil {
		return nil, err
	}
	switch {
	case cred != nil && cred.Uid != uid:
		return nil, errdefs.FailedPrecondition("the image's user %s has uid %d, and the runtime runs as uid %d (the id its shares are mapped for): give %s uid %d in the image, or leave the user out and the guest adds it", name, cred.Uid, uid, name, uid)
	case cred == nil && owner != "":
		return nil, errdefs.FailedPrecondition("uid %d belongs to %s in the image's /etc/passwd, and the runtime runs as %s with that uid: free the uid in the image", uid, owner, name)
	case cred == nil:
		if err := addUser(passwd, group, name, uid); err != nil {
			return nil, fmt.Errorf("add the runtime user %s (uid %d) to the image's accounts: %w", name, uid, err)
		}
		cred = &syscall.Credential{Uid: uid, Gid: uid}
	}
	// The supplementary groups; the primary one too, as login(1) has it.
	cred.Groups = []uint32{cred.Gid}
	eachEntry(group, func(f []string) bool {
		if len(f) >= 4 && hasMember(f[3], name) {
			if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(gid) != cred.Gid {
				cred.Groups = append(cred.Groups, uint32(gid))
			}
		}
		return true
	})
	return cred, nil
}

// findUser reads passwd for name (its uid and primary gid) and for the
// name that holds uid, if another does. A missing file is an empty one.
func findUser(passwd, name string, uid uint32) (cred *syscall.Credential, owner string, err error) {
	err = eachEntry(passwd, func(f []string) bool {
		if len(f) < 4 {
			return true
		}
		u, err1 := strconv.ParseUint(f[2], 10, 32)
		g, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		if f[0] == name {
			cred = &syscall.Credential{Uid: uint32(u), Gid: uint32(g)}
		} else if uint32(u) == uid && owner == "" {
			owner = f[0]
		}
		return true
	})
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return cred, owner, err
}

// addUser appends name with uid (and a group of the same name and id,
// unless a group has that id already) to the account files, and makes it a
// member of the docker group when there is one. Each file is replaced
// whole (write, sync, rename), so a power-off leaves the old or the new.
func addUser(passwd, group, name string, uid uint32) error {
	lines, err := readLines(group)
	if err != nil {
		return err
	}
	gid := strconv.FormatUint(uint64(uid), 10)
	gidTaken := false
	for i, l := range lines {
		f := strings.Split(l, ":")
		if len(f) < 4 {
			continue
		}
		if f[2] == gid {
			gidTaken = true
		}
		if f[0] == "docker" && !hasMember(f[3], name) {
			if f[3] != "" {
				f[3] += ","
			}
			f[3] += name
			lines[i] = strings.Join(f, ":")
		}
	}
	if !gidTaken {
		lines = append(lines, name+":x:"+gid+":")
	}
	users, err := readLines(passwd)
	if err != nil {
		return err
	}
	users = append(users, fmt.Sprintf("%s:x:%d:%d:agentconnect runtime:/home/%s:/bin/sh", name, uid, uid, name))
	if err := writeLines(group, lines); err != nil {
		return err
	}
	return writeLines(passwd, users)
}

func hasMember(members, name string) bool {
	for _, m := range strings.Split(members, ",") {
		if m == name {
			return true
		}
	}
	return false
}

// readLines is a file's lines; a missing file has none.
func readLines(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, "\n"), nil
}

// writeLines replaces path with lines, mode 0644, through a file beside it.
func writeLines(path string, lines []string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".agentconnect"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// groupID looks a group up in an /etc/group file.
func groupID(path, name string) (int, bool) {
	gid, found := 0, false
	eachEntry(path, func(f []string) bool {
		if len(f) >= 3 && f[0] == name {
			id, err := strconv.Atoi(f[2])
			gid, found = id, err == nil
			return false
		}
		return true
	})
	return gid, found
}

// eachEntry calls fn with the colon-separated fields of each line of an
// account file, until it returns false.
func eachEntry(path string, fn func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if !fn(strings.Split(sc.Text(), ":")) {
			break
		}
	}
	return sc.Err()
}
