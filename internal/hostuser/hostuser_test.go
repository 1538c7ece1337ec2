package hostuser

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
)

func TestLookup(t *testing.T) {
	u, err := Lookup("nobody")
	if err != nil {
		t.Skipf("no account nobody here: %v", err)
	}
	if u.UID == 0 || u.Name != "nobody" {
		t.Errorf("nobody: %+v", u)
	}
	if _, err := Lookup("root"); err == nil || !strings.Contains(err.Error(), "is root") {
		t.Errorf("root: %v, want a refusal", err)
	}
	if _, err := Lookup("no-such-account-here"); err == nil || !strings.Contains(err.Error(), "useradd") {
		t.Errorf("a missing account: %v, want the way to make it", err)
	}
}

func TestCheck(t *testing.T) {
	nobody, err := Lookup("nobody")
	if err != nil {
		t.Skipf("no account nobody here: %v", err)
	}
	home := filepath.Join(t.TempDir(), "home")
	os.Mkdir(home, 0o700)
	for _, tc := range []struct {
		name string
		euid int
		home string
		want string // substring; "" for none
	}{
		{name: "the daemon is the account", euid: int(nobody.UID), home: home},
		{name: "an unprivileged daemon", euid: int(nobody.UID) - 1, home: home, want: "only a root daemon"},
		{name: "a home below a private directory", euid: 0, home: home, want: "cannot reach the daemon's home " + home},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check("nobody", tc.euid, tc.home)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Check = %q, want %q", got, tc.want)
			}
		})
	}
	// The home's parent searchable: the home itself is the daemon's to open.
	os.Chmod(filepath.Dir(home), 0o711)
	if got := Check("nobody", 0, home); got != "" && !strings.Contains(got, filepath.Dir(filepath.Dir(home))) {
		t.Errorf("with the parent searchable the check names %q", got)
	}
}

func TestSearchable(t *testing.T) {
	r := &session.RunAs{UID: 1000, GID: 1000, Groups: []uint32{1000, 27}}
	for _, tc := range []struct {
		mode     os.FileMode
		uid, gid uint32
		want     bool
	}{
		{0o700, 1000, 0, true},
		{0o070, 1000, 0, false}, // the owner's bits, not the group's
		{0o710, 0, 27, true},
		{0o701, 0, 27, false}, // the group's bits, not the others'
		{0o701, 0, 0, true},
		{0o750, 0, 0, false},
	} {
		if got := searchable(tc.mode, tc.uid, tc.gid, r); got != tc.want {
			t.Errorf("mode %04o owner %d:%d: %v, want %v", tc.mode, tc.uid, tc.gid, got, tc.want)
		}
	}
}

// TestOwnAndOpenPath: Own hands a directory tree over without following a
// link in it, and once it is the account's leaves it; OpenPath adds the
// search bit only.
func TestOwnAndOpenPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another account needs root")
	}
	r := &session.RunAs{Name: "nobody", UID: 65534, GID: 65534}
	dir, outside := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(dir, "a", "b"), 0o700)
	os.WriteFile(filepath.Join(dir, "a", "b", "f"), nil, 0o600)
	os.WriteFile(filepath.Join(outside, "target"), nil, 0o600)
	os.Symlink(filepath.Join(outside, "target"), filepath.Join(dir, "a", "link"))
	if err := Own(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "a", "b"), filepath.Join(dir, "a", "b", "f"), filepath.Join(dir, "a", "link")} {
		fi, _ := os.Lstat(p)
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != r.UID || st.Gid != r.GID {
			t.Errorf("%s: %d:%d", p, st.Uid, st.Gid)
		}
	}
	if fi, _ := os.Stat(filepath.Join(outside, "target")); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("Own followed a link out of the directory")
	}
	// Handed over already: a root file made since stays root's.
	os.WriteFile(filepath.Join(dir, "later"), nil, 0o600)
	if err := Own(dir, r); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "later")); fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Error("Own walked a directory that was the account's already")
	}
	if err := Own(filepath.Join(dir, "a", "link"), r); err == nil {
		t.Error("Own took a link for a directory")
	}

	priv := filepath.Join(t.TempDir(), "p")
	os.Mkdir(priv, 0o700)
	if err := OpenPath(priv); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(priv); fi.Mode().Perm() != 0o701 {
		t.Errorf("OpenPath made %04o, want 0701", fi.Mode().Perm())
	}
}
