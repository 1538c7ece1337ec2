package vmagent

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// lookupUser is the credential of user name in the account files of etc:
// its uid and primary gid from passwd, and every group of group that lists
// it as a member (docker, for the runtime user).
func lookupUser(etc, name string) (*syscall.Credential, error) {
	var cred *syscall.Credential
	err := eachEntry(etc+"/passwd", func(f []string) bool {
		if len(f) < 4 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 == nil && err2 == nil {
			cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
		return false
	})
	if err != nil || cred == nil {
		return nil, errdefs.FailedPrecondition("no user %q in the image's %s/passwd (an image older than this release: rebuild it with make image)", name, etc)
	}
	// The supplementary groups; the primary one too, as login(1) has it.
	cred.Groups = []uint32{cred.Gid}
	eachEntry(etc+"/group", func(f []string) bool {
		if len(f) < 4 {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == name {
				if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(gid) != cred.Gid {
					cred.Groups = append(cred.Groups, uint32(gid))
				}
			}
		}
		return true
	})
	return cred, nil
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
