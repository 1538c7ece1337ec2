package supervisor

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

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
	if err := writeLogin(home, l, content); err != nil {
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
	if err := writeLogin(home, l, content); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(target); string(data) != "mine" {
		t.Error("the write went through a symlink")
	}
	// A directory on the way a symlink: refused.
	os.RemoveAll(filepath.Join(home, ".claude"))
	os.Symlink(outside, filepath.Join(home, ".claude"))
	if err := writeLogin(home, l, content); err == nil {
		t.Error("the write followed a symlinked directory")
	}
	if _, err := os.Stat(filepath.Join(outside, ".credentials.json")); err == nil {
		t.Error("the file was written outside the home")
	}
}
