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
