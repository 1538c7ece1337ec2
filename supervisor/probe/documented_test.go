package probe

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/hostuser"
	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

const operationsGuide = "../../docs/operations.md"

// TestReasonsAreDocumented produces each reason the host and srt checks
// give (from the checks themselves, with the inputs that lead to it) and
// requires the operator guide to have it.
func TestReasonsAreDocumented(t *testing.T) {
	on := Sysctls{AppArmorRestrictUserns: 0, MaxUserNamespaces: 15000, UnprivilegedUsernsClone: 1}
	restricted := on
	restricted.AppArmorRestrictUserns = 1
	cloneOff, maxOff, bothOff := on, on, on
	cloneOff.UnprivilegedUsernsClone = 0
	maxOff.MaxUserNamespaces = 0
	bothOff.UnprivilegedUsernsClone, bothOff.MaxUserNamespaces = 0, 0
	msgs := []string{
		ReasonBwrapMissing,
		CheckSRT(filepath.Join(t.TempDir(), "no-bwrap")),
		landlockReason(0),
		ClassifySRT("bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted", restricted),
		ClassifySRT("bwrap: setting up uid map: Permission denied", on),
		ClassifySRT("bwrap: No permissions to create new namespace", cloneOff),
		ClassifySRT("", maxOff),
		ClassifySRT("bwrap: Creating new namespace failed", bothOff),
		ClassifySRT("bwrap: No permissions to create new namespace", on),
		ClassifySRT("bwrap: No permissions to create new namespace", restricted),
		ClassifySRT("bwrap: Can't mount proc on /newroot/proc: Operation not permitted", on),
		checkMicrosandbox(config.Default(), Env{}),
		checkMicrosandbox(config.Default(), Env{VMShimBinary: "/usr/local/bin/agentconnect-shim-vm"}),
		hostuser.Check("agentconnect-no-such-user", 0, "/var/lib/agentconnect"),
		hostuser.Check("root", 0, "/var/lib/agentconnect"),
	}
	// An account other than the daemon's, under a daemon that is not root.
	msgs = append(msgs, hostuser.Check("nobody", 1000, "/var/lib/agentconnect"))
	// A home the account cannot reach.
	dir := filepath.Join(t.TempDir(), "closed")
	if err := os.MkdirAll(filepath.Join(dir, "home"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o700)
	msgs = append(msgs, hostuser.Check("nobody", 0, filepath.Join(dir, "home")))
	if c, err := config.Parse([]byte(`{"sandbox": {"host": false, "srt": false, "microsandbox": false}}`)); err == nil {
		for _, r := range Run(c, Env{}) {
			msgs = append(msgs, r.Reason)
		}
	} else {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if m == "" {
			t.Fatalf("a check gave no reason where the test expects one: %q", msgs)
		}
	}
	testutil.Documented(t, operationsGuide, msgs...)
}
