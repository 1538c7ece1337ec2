package fileid

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A file keeps its ID until it is rewritten, replaced, touched or
// removed.
func TestIdentify(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	write := func(data string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("one")
	ids, err := All([]string{p})
	if err != nil {
		t.Fatal(err)
	}
	if !Unchanged(ids...) {
		t.Fatalf("an untouched file is changed: %+v", ids)
	}
	changes := []struct {
		what string
		do   func()
	}{
		{"rewritten longer", func() { write("one two") }},
		{"touched", func() { os.Chtimes(p, time.Now(), time.Unix(1, 0)) }},
		{"replaced by a rename", func() {
			os.WriteFile(p+".new", []byte("one two"), 0o644)
			os.Rename(p+".new", p)
		}},
		{"removed", func() { os.Remove(p) }},
	}
	for _, c := range changes {
		c.do()
		if Unchanged(ids...) {
			t.Errorf("%s: still unchanged", c.what)
		}
		if c.what != "removed" {
			if ids, err = All([]string{p}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := All([]string{p}); !os.IsNotExist(err) {
		t.Errorf("All(a removed file) = %v, want not exist", err)
	}
}
