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

// TestManyWatchersOneInstance: more watchers than the kernel's default
// limit of inotify instances per user (128) all work, two on one file both
// wake, and a closed one no longer does while the other still does.
func TestManyWatchersOneInstance(t *testing.T) {
	dir := t.TempDir()
	var ws []*Watcher
	var files []*os.File
	for i := range 300 {
		path := filepath.Join(dir, "log"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		w, err := Watch(path)
		if err != nil {
			t.Fatalf("watcher %d: %v", i+1, err)
		}
		ws, files = append(ws, w), append(files, f)
	}
	twin, err := Watch(files[299].Name())
	if err != nil {
		t.Fatal(err)
	}
	defer twin.Close()
	files[299].Write([]byte("x"))
	for _, w := range []*Watcher{ws[299], twin} {
		select {
		case <-w.C:
		case <-time.After(10 * time.Second):
			t.Fatal("a watcher of the written file did not wake")
		}
	}
	select {
	case <-ws[0].C:
		t.Fatal("a watcher of another file woke")
	case <-time.After(50 * time.Millisecond):
	}
	ws[299].Close()
	files[299].Write([]byte("y"))
	select {
	case <-twin.C:
	case <-time.After(10 * time.Second):
		t.Fatal("closing one of two watchers of a file stopped the other")
	}
	for _, w := range ws[:299] {
		w.Close()
	}
}
