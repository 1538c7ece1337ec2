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

func TestLookupUser(t *testing.T) {
	etc := t.TempDir()
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/bash\nagent:x:10001:10001::/home/agent:/bin/bash\nbad:x:nope:1::/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\ndocker:x:998:someone,agent\nagentish:x:5:agentx\nagent:x:10001:\n"), 0o644)
	c, err := lookupUser(etc, "agent")
	if err != nil {
		t.Fatal(err)
	}
	if c.Uid != 10001 || c.Gid != 10001 || fmt.Sprint(c.Groups) != "[10001 998]" {
		t.Errorf("agent: uid %d gid %d groups %v; want 10001 10001 [10001 998]", c.Uid, c.Gid, c.Groups)
	}
	for _, name := range []string{"nobody", "bad", ""} {
		if _, err := lookupUser(etc, name); err == nil || !strings.Contains(err.Error(), "make image") {
			t.Errorf("user %q: %v, want an error that says to rebuild the image", name, err)
		}
	}
	if _, err := lookupUser(t.TempDir(), "agent"); err == nil {
		t.Error("a user was found without a passwd file")
	}
}
