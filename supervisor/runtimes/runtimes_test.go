package runtimes

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// TestInstall installs the real claude-agent-acp from npm: the tree is named
// by its lock's digest, read-only, and found again; a second install asks
// npm nothing; an update installs again into the same tree.
func TestInstall(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("npm is not installed (make deps installs it)")
	}
	c := Open(t.TempDir())
	calls := 0
	c.NPM = func(ctx context.Context, dir string, args ...string) ([]byte, error) {
		calls++
		return runNPM(ctx, dir, args...)
	}
	in, err := c.Install(context.Background(), "claude", false)
	if err != nil {
		t.Fatal(err)
	}
	if in.Version != Known["claude"].Version || len(in.Digest) != 64 || calls != 1 {
		t.Errorf("installed %+v after %d npm runs", in, calls)
	}
	entry := filepath.Join(c.Dir(in), Known["claude"].Entry)
	if _, err := os.Stat(entry); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(c.Dir(in), "package-lock.json")); fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("the tree is writable: %v", fi.Mode())
	}
	if got, ok := c.Get("claude"); !ok || got.Digest != in.Digest {
		t.Errorf("Get = %+v %v", got, ok)
	}
	if again, err := c.Install(context.Background(), "claude", false); err != nil || again.Digest != in.Digest || calls != 1 {
		t.Errorf("a second install: %+v %v after %d npm runs, want the same tree and no npm", again, err, calls)
	}
	if upd, err := c.Install(context.Background(), "claude", true); err != nil || upd.Digest != in.Digest || calls != 2 {
		t.Errorf("update: %+v %v after %d npm runs", upd, err, calls)
	}
	if left, _ := filepath.Glob(filepath.Join(c.dir, ".install-*")); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// TestInstallRefusalsLeaveNothing: an unknown runtime is refused; a failed
// npm leaves no tree and no record.
func TestInstallRefusalsLeaveNothing(t *testing.T) {
	c := Open(t.TempDir())
	if _, err := c.Install(context.Background(), "nope", false); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "claude, codex, gemini, opencode") {
		t.Errorf("unknown runtime: %v", err)
	}
	c.NPM = func(context.Context, string, ...string) ([]byte, error) {
		return []byte("npm ERR! 404 Not Found"), errors.New("exit status 1")
	}
	if _, err := c.Install(context.Background(), "codex", false); err == nil || !strings.Contains(err.Error(), "404 Not Found") {
		t.Errorf("a failed npm: %v", err)
	}
	entries, _ := os.ReadDir(c.dir)
	for _, e := range entries {
		if e.Name() != "store" {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	if _, ok := c.Get("codex"); ok {
		t.Error("a failed install is installed")
	}
}
