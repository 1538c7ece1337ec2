package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileReplacesAndLeavesNoTemp(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"WriteFile": WriteFile, "WriteVolatile": WriteVolatile} {
		t.Run(name, func(t *testing.T) { testReplace(t, write) })
	}
}

func testReplace(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, content := range []string{"one", "two"} {
		if err := write(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Errorf("content = %q, want %q", got, content)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("dir has %d entries, want 1 (no temporary files left)", len(entries))
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
}

func TestJSONRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.json")
	type rec struct{ A int }
	if err := WriteJSON(path, rec{A: 7}, 0o600); err != nil {
		t.Fatal(err)
	}
	var got rec
	if err := ReadJSON(path, &got); err != nil {
		t.Fatal(err)
	}
	if got.A != 7 {
		t.Errorf("A = %d, want 7", got.A)
	}
	os.WriteFile(path, []byte("{"), 0o600)
	if err := ReadJSON(path, &got); err == nil {
		t.Error("ReadJSON of a torn file succeeded, want an error")
	}
}

func TestWriteFileMissingDir(t *testing.T) {
	if err := WriteFile(filepath.Join(t.TempDir(), "no", "such"), nil, 0o600); err == nil {
		t.Error("WriteFile into a missing directory succeeded")
	}
}

// Sync is what makes a volatile write durable: it fails, naming the file,
// when there is none to sync, and leaves a written one as it is.
func TestSync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "session.json")
	if err := Sync(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Sync of a missing file = %v, want an error naming %s", err, path)
	}
	if err := WriteVolatile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Sync(path); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != "one" {
		t.Errorf("after Sync: %q, %v; want %q", got, err, "one")
	}
}
