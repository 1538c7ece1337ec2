package shim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// readonlyExec is `agentconnect-shim readonly-exec DIR -- PROGRAM ARGS...`,
// started in a mount namespace of its own (the shim unshares it at fork):
// DIR becomes a read-only bind of itself there, then PROGRAM runs. virtiofsd
// serving a read-only share cannot write to it then, whatever the guest asks.
func readonlyExec(args []string) error {
	if len(args) < 3 || args[1] != "--" {
		return errors.New("usage: readonly-exec DIR -- PROGRAM [ARG...]")
	}
	dir, argv := args[0], args[2:]
	// Our mounts must not propagate back to the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("readonly-exec: make mounts private: %w", err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("readonly-exec: bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("readonly-exec: make %s read-only: %w", dir, err)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("readonly-exec: %w", err)
	}
	return fmt.Errorf("readonly-exec: exec %s: %w", path, syscall.Exec(path, argv, os.Environ()))
}
