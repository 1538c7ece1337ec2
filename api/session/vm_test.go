package session

import "testing"

// TestIdentityHoldsTheCredentialLayout: where secrets are inside is part
// of a VM's identity; a VM without any keeps the identity it had before
// the layout was recorded.
func TestIdentityHoldsTheCredentialLayout(t *testing.T) {
	base := VM{ImageDigest: "sha256:abc", CPUs: 2, MemoryMiB: 512, DiskGiB: 4}
	// The identity of such a VM before CredentialLayout existed.
	const before = "8646cf031177b7cc"
	if got := base.Identity(); got != before {
		t.Errorf("a VM without secrets changed identity: %s, was %s", got, before)
	}
	with := base
	with.CredentialLayout = []string{"env ANTHROPIC_API_KEY=anthropic"}
	renamed := base
	renamed.CredentialLayout = []string{"env CLAUDE_KEY=anthropic"}
	ids := map[string]bool{base.Identity(): true, with.Identity(): true, renamed.Identity(): true}
	if len(ids) != 3 {
		t.Errorf("identities %v: a change of the credential layout must change it", ids)
	}
}
