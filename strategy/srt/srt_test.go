package srt

import (
	"testing"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// An srt start (the sandbox coming up, then its pid) ends within the
// StartTimeout the supervisor waits for.
func TestStartFitsStartTimeout(t *testing.T) {
	if d := 2 * sandboxReadyTimeout; d >= shimv1.StartTimeout {
		t.Errorf("an srt start takes up to %v, not within shimv1.StartTimeout %v", d, shimv1.StartTimeout)
	}
}
