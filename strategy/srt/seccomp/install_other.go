//go:build !(linux && amd64)

package seccomp

import (
	"fmt"
	"runtime"
)

// Install fails on every platform but linux/amd64: the filter is written for
// the x86_64 syscall table only, and a sandbox without it must not start.
func Install(o Options) error {
	return fmt.Errorf("seccomp filter: unsupported architecture %s/%s", runtime.GOOS, runtime.GOARCH)
}
