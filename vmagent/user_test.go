package vmagent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGroupID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "group")
	os.WriteFile(path, []byte("root:x:0:\ndockerish:x:7:\ndocker:x:998:agent\nbad\n"), 0o644)
	if gid, ok := groupID(path, "docker"); !ok || gid != 998 {
		t.Errorf("docker: %d, %v; want 998", gid, ok)
	}
	if _, ok := groupID(path, "nope"); ok {
		t.Error("a group that is not there was found")
	}
	if _, ok := groupID(filepath.Join(t.TempDir(), "none"), "docker"); ok {
		t.Error("a group was found in a missing file")
	}
}

func TestRuntimeUser(t *testing.T) {
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/bash\nagent:x:10001:10001::/home/agent:/bin/bash\nbad:x:nope:1::/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\ndocker:x:998:someone,agent\nagentish:x:5:agentx\nagent:x:10001:\n"), 0o644)
	c, err := runtimeUser(etc, "agent", 10001)
	if err != nil {
		t.Fatal(err)
	}
	if c.Uid != 10001 || c.Gid != 10001 || fmt.Sprint(c.Groups) != "[10001 998]" {
		t.Errorf("agent: uid %d gid %d groups %v; want 10001 10001 [10001 998]", c.Uid, c.Gid, c.Groups)
	}
	before, _ := os.ReadFile(filepath.Join(etc, "passwd"))
	// The name with another uid, or the uid with another name: refused,
	// and the files stay as they are.
	if _, err := runtimeUser(etc, "agent", 10002); err == nil || !strings.Contains(err.Error(), "has uid 10001") {
		t.Errorf("agent as 10002: %v, want the image's uid named", err)
	}
	if _, err := runtimeUser(etc, "runner", 10001); err == nil || !strings.Contains(err.Error(), "belongs to agent") {
		t.Errorf("runner as 10001: %v, want the owner of the uid named", err)
	}
	if after, _ := os.ReadFile(filepath.Join(etc, "passwd")); string(after) != string(before) {
		t.Errorf("a refused user changed passwd:\n%s", after)
	}
}

// TestRuntimeUserAdded: an image without the user (a custom image, or one
// with no account files at all) gets it, in the docker group if there is
// one, and a second lookup finds it rather than adding it again.
func TestRuntimeUserAdded(t *testing.T) {
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\ndocker:x:998:someone\n"), 0o644)
	for i := 0; i < 2; i++ {
		c, err := runtimeUser(etc, "agent", 10001)
		if err != nil {
			t.Fatal(err)
		}
		if c.Uid != 10001 || c.Gid != 10001 || fmt.Sprint(c.Groups) != "[10001 998]" {
			t.Errorf("run %d: uid %d gid %d groups %v; want 10001 10001 [10001 998]", i, c.Uid, c.Gid, c.Groups)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(etc, "passwd"))
	group, _ := os.ReadFile(filepath.Join(etc, "group"))
	if want := "root:x:0:0:root:/root:/bin/sh\nagent:x:10001:10001:agentconnect runtime:/home/agent:/bin/sh\n"; string(passwd) != want {
		t.Errorf("passwd:\n%s\nwant:\n%s", passwd, want)
	}
	if want := "root:x:0:\ndocker:x:998:someone,agent\nagent:x:10001:\n"; string(group) != want {
		t.Errorf("group:\n%s\nwant:\n%s", group, want)
	}
	if fi, err := os.Stat(filepath.Join(etc, "passwd")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("passwd mode: %v (%v), want 0644", fi.Mode(), err)
	}

	bare := filepath.Join(t.TempDir(), "etc")
	c, err := runtimeUser(bare, "agent", 10001)
	if err != nil || c.Uid != 10001 || fmt.Sprint(c.Groups) != "[10001]" {
		t.Fatalf("no account files: %+v, %v", c, err)
	}
	if group, _ := os.ReadFile(filepath.Join(bare, "group")); string(group) != "agent:x:10001:\n" {
		t.Errorf("group made from nothing: %q", group)
	}
}
