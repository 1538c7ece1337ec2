// Package atomicfile writes files so that a crash at any instant leaves either
// the old content or the new one, never a torn file.
package atomicfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile writes data to a temporary file in the same directory, fsyncs it,
// renames it over path and fsyncs the directory, so the rename is durable too.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// WriteVolatile is WriteFile without the fsyncs: still atomic for any
// process that crashes (the rename is), not durable across a power loss.
// It is for files that describe live processes (a shim's address, a
// running runtime's pid), which mean nothing after a reboot anyway; each
// fsync costs about a millisecond on a session's start path.
func WriteVolatile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

// Sync makes a file that WriteVolatile wrote durable, as WriteFile would
// have: its data, then its directory's entry. A writer that must not wait
// for the disk before the file is read writes it with WriteVolatile and
// syncs it meanwhile.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func write(path string, data []byte, perm os.FileMode, durable bool) (retErr error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("write %s: sync: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	return syncDir(dir)
}

// WriteJSON writes v as indented JSON with WriteFile.
func WriteJSON(path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return WriteFile(path, append(data, '\n'), perm)
}

// WriteVolatileJSON writes v as indented JSON with WriteVolatile.
func WriteVolatileJSON(path string, v any, perm os.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return WriteVolatile(path, append(data, '\n'), perm)
}

// ReadJSON reads the JSON file at path into v.
func ReadJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
