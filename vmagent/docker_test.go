package vmagent

import (
	"os"
	"path/filepath"
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
