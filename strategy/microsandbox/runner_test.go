package microsandbox

import (
	"testing"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// A VM's start (its boot, then its calls to the guest agent) ends within the
// StartTimeout the supervisor waits for.
func TestStartFitsStartTimeout(t *testing.T) {
	if d := bootTimeout + vmCallTimeout; d >= shimv1.StartTimeout {
		t.Errorf("a VM start takes up to %v, not within shimv1.StartTimeout %v", d, shimv1.StartTimeout)
	}
}
