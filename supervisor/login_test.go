package supervisor

import (
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// TestWriteLogin: the credentials file lands in the agent's home, 0600; a
// symlink the runtime planted in its home, as a directory on the way or as
// the file, sends nothing elsewhere.
func TestWriteLogin(t *testing.T) {
	home, outside := t.TempDir(), t.TempDir()
	l := &agent.Login{Runtime: "claude", File: ".claude/.credentials.json", Template: `{"t":"{{a-claude-access}}"}`}
	if got := l.LoginSecrets(); !reflect.DeepEqual(got, []string{"a-claude-access"}) {
		t.Errorf("LoginSecrets = %v", got)
	}
	content := l.Render(func(string) string { return "agentconnect-placeholder-x" })
	if err := writeLogin(home, l, content, nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(home, l.File)
	if data, err := os.ReadFile(path); err != nil || string(data) != `{"t":"agentconnect-placeholder-x"}` {
		t.Errorf("the file: %q %v", data, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	// The file itself a symlink: replaced, its target untouched.
	target := filepath.Join(outside, "bashrc")
	os.WriteFile(target, []byte("mine"), 0o644)
	os.Remove(path)
	os.Symlink(target, path)
	if err := writeLogin(home, l, content, nil); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(target); string(data) != "mine" {
		t.Error("the write went through a symlink")
	}
	// A directory on the way a symlink: refused.
	os.RemoveAll(filepath.Join(home, ".claude"))
	os.Symlink(outside, filepath.Join(home, ".claude"))
	if err := writeLogin(home, l, content, nil); err == nil {
		t.Error("the write followed a symlinked directory")
	}
	if _, err := os.Stat(filepath.Join(outside, ".credentials.json")); err == nil {
		t.Error("the file was written outside the home")
	}
}

// TestWriteLoginOwner: for a host run as sandbox.host.user, the file and
// the directories made on its way belong to that account, so that its
// runtime reads them; a directory that was there keeps its owner.
func TestWriteLoginOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another account needs root")
	}
	home := t.TempDir()
	os.Mkdir(filepath.Join(home, ".config"), 0o700)
	l := &agent.Login{Runtime: "claude", File: ".config/claude/.credentials.json", Template: `{}`}
	owner := &session.RunAs{Name: "nobody", UID: 65534, GID: 65534}
	if err := writeLogin(home, l, "{}", owner); err != nil {
		t.Fatal(err)
	}
	for rel, uid := range map[string]uint32{".config": 0, ".config/claude": 65534, l.File: 65534} {
		fi, err := os.Lstat(filepath.Join(home, rel))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || (uid != 0 && st.Gid != 65534) {
			t.Errorf("%s: owned by %d:%d, want uid %d", rel, st.Uid, st.Gid, uid)
		}
	}
}
