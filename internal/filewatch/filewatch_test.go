package filewatch

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWatcherWakesOnWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := Watch(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	select {
	case <-w.C:
		t.Fatal("a wakeup before any write")
	case <-time.After(50 * time.Millisecond):
	}
	f.Write([]byte("x"))
	select {
	case <-w.C:
	case <-time.After(10 * time.Second):
		t.Fatal("no wakeup after a write")
	}
}

func TestWatchMissingFile(t *testing.T) {
	if _, err := Watch(filepath.Join(t.TempDir(), "nope")); err == nil {
		t.Error("Watch of a missing file succeeded")
	}
}

func TestWatchReplacedWakesOnRenameOnly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	w, err := WatchReplaced(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Other files of the directory, renamed or written, do not wake it.
	os.WriteFile(filepath.Join(dir, ".other.tmp"), []byte("x"), 0o600)
	os.Rename(filepath.Join(dir, ".other.tmp"), filepath.Join(dir, "other.json"))
	select {
	case <-w.C:
		t.Fatal("a wakeup for another file")
	case <-time.After(50 * time.Millisecond):
	}
	for i := range 2 {
		tmp := filepath.Join(dir, ".state.json.tmp")
		os.WriteFile(tmp, []byte("x"), 0o600)
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.C:
		case <-time.After(10 * time.Second):
			t.Fatalf("no wakeup after rename %d", i+1)
		}
	}
}
