package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The daemon and the CLI link no boundary code: what they share with the
// shims lives in api/ and internal/. The strategies' packages, and the
// libraries only a boundary needs, stay in the shims.
func TestLinksNoBoundaryCode(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list the dependencies with: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"gvisor.dev/", "github.com/landlock-lsm/", "github.com/hashicorp/yamux", "github.com/mdlayher/vsock",
		"github.com/google/go-containerregistry/",
		"github.com/agentconnect-md/agentconnect/strategy/", "github.com/agentconnect-md/agentconnect/shim",
		"github.com/agentconnect-md/agentconnect/vmagent",
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				t.Errorf("agentconnect links %s", d)
			}
		}
	}
	if len(deps) < 10 {
		t.Errorf("go list -deps named only %d packages: %q", len(deps), deps)
	}
}
