package protect

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// The main goroutine keeps the main thread, as the shim's does: a thread
// left in a namespace of its own ends with its goroutine, unless it is the
// main thread, which Go wedges instead (and /proc/self is the main thread).
func init() { runtime.LockOSThread() }

// inMountNS runs f on a thread of its own with a mount namespace of its own,
// as a shim's forking thread does, and returns f's error; the thread ends
// with it.
func inMountNS(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread goes with its namespace
		if err := NewMountNS(); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return <-done
}

// mountsAt lists the mount points under dir in mountinfo.
func mountsAt(t *testing.T, mountinfo, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(mountinfo)
	if err != nil {
		t.Fatal(err)
	}
	var at []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 5 && strings.HasPrefix(f[4], dir+"/") {
			at = append(at, f[4]+" "+f[5])
		}
	}
	return at
}

func TestPremountBindsTheProtectedNames(t *testing.T) {
	testutil.RequiresRoot(t)
	ws, p := repoPlan(t)
	err := inMountNS(t, func() error {
		if err := Premount(p.Roots); err != nil {
			return err
		}
		// Every protected name is a read-only, nosuid, nodev mount here, the
		// git directory a writable one, and the root itself no mount.
		ro, _ := binds(p)
		mounts := map[string]string{}
		for _, m := range mountsAt(t, "/proc/thread-self/mountinfo", ws) {
			at, opts, _ := strings.Cut(m, " ")
			mounts[at] = opts
		}
		for target, readOnly := range ro {
			if target == ws {
				continue
			}
			opts, ok := mounts[target]
			if !ok {
				t.Errorf("%s is not a mount in the namespace: %v", target, mounts)
				continue
			}
			if strings.HasPrefix(opts, "ro,") != readOnly || !strings.Contains(opts, "nosuid") || !strings.Contains(opts, "nodev") {
				t.Errorf("%s mounted %s, want read-only %v, nosuid, nodev", target, opts, readOnly)
			}
		}
		if len(mounts) != len(ro)-1 {
			t.Errorf("%d mounts under the root, want %d (its binds but itself)", len(mounts), len(ro)-1)
		}
		if err := os.WriteFile(filepath.Join(ws, ".git", "hooks", "pre-commit"), []byte("#!/bin/sh\n"), 0o755); !errors.Is(err, unix.EROFS) {
			t.Errorf("create a git hook in the namespace: %v, want EROFS", err)
		}
		if err := os.WriteFile(filepath.Join(ws, "a.txt"), []byte("x"), 0o644); err != nil {
			t.Errorf("write the workspace in the namespace: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing of it reached the host's namespace.
	if m := mountsAt(t, "/proc/self/mountinfo", ws); len(m) != 0 {
		t.Errorf("the host sees mounts of the premount: %v", m)
	}
	if err := os.WriteFile(filepath.Join(ws, ".git", "hooks", "x"), nil, 0o644); err != nil {
		t.Errorf("the host's own write of a hook: %v", err)
	}
}

func TestPremountRefusesASwapSincePrepare(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, tc := range []struct {
		name string
		swap func(ws string) error
	}{
		{"file replaced", func(ws string) error {
			cfg := filepath.Join(ws, ".git", "config")
			if err := os.Rename(cfg, cfg+".old"); err != nil {
				return err
			}
			return os.WriteFile(cfg, nil, 0o644)
		}},
		{"directory on the way replaced by a symlink", func(ws string) error {
			git := filepath.Join(ws, ".git")
			decoy := filepath.Join(ws, "decoy")
			if err := os.MkdirAll(filepath.Join(decoy, "hooks"), 0o755); err != nil {
				return err
			}
			if err := os.Rename(git, filepath.Join(ws, "moved")); err != nil {
				return err
			}
			return os.Symlink("decoy", git)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, p := repoPlan(t)
			if err := tc.swap(ws); err != nil {
				t.Fatal(err)
			}
			err := inMountNS(t, func() error { return Premount(p.Roots) })
			if err == nil || !strings.Contains(err.Error(), "start the session again") {
				t.Errorf("Premount after a swap = %v, want it to refuse", err)
			}
		})
	}
}
