// Package testutil holds the checks tests use to skip, with a message, where
// the machine lacks what they need, and the check that the messages users
// read are in the docs.
package testutil

import (
	"os"
	"testing"
)

// RequiresRoot skips the test unless it runs as root. CI runs as root, so
// these tests always run there.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root); skipped as uid", os.Geteuid())
	}
}
