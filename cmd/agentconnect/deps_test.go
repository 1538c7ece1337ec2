package main

import (
	"os/exec"
	"strings"
	"testing"
)

// What each binary must not link, because every process of it would carry
// it: the daemon and the CLI no boundary code (what they share with the
// shims lives in api/ and internal/); the host/srt shim, one per session, no
// VM stack and none of protobuf's and gRPC's runtimes (internal/ttrpclite
// speaks the shim API on protowire); the VM shim, one per VM, none of the
// registry code (agentconnect-vmimage prepares images); neither shim TLS
// or x509 (agentconnect-inject does a session's interception).
func TestLinksNoBoundaryCode(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list the dependencies with: %v", err)
	}
	boundary := []string{
		"gvisor.dev/", "github.com/landlock-lsm/", "github.com/hashicorp/yamux", "github.com/mdlayher/vsock",
		"github.com/google/go-containerregistry/",
		"github.com/agentconnect-md/agentconnect/strategy/", "github.com/agentconnect-md/agentconnect/shim",
		"github.com/agentconnect-md/agentconnect/vmagent",
	}
	for _, c := range []struct {
		pkg       string
		forbidden []string
	}{
		{".", boundary},
		{"../agentconnect-shim", []string{
			"gvisor.dev/", "github.com/hashicorp/yamux", "github.com/mdlayher/vsock", "github.com/google/go-containerregistry/",
			"github.com/agentconnect-md/agentconnect/strategy/microsandbox",
			"github.com/containerd/ttrpc", "google.golang.org/grpc", "google.golang.org/protobuf/reflect/",
			"google.golang.org/protobuf/proto", "net/http", "crypto/tls", "crypto/x509",
		}},
		{"../agentconnect-shim-vm", []string{
			"github.com/google/go-containerregistry/pkg/v1/remote", "github.com/docker/", "net/http", "crypto/tls", "crypto/x509",
		}},
	} {
		out, err := exec.Command(goTool, "list", "-deps", c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		deps := strings.Fields(string(out))
		for _, d := range deps {
			for _, f := range c.forbidden {
				if d == f || strings.HasPrefix(d, strings.TrimSuffix(f, "/")+"/") || (strings.HasSuffix(f, "/") && strings.HasPrefix(d, f)) {
					t.Errorf("%s links %s", c.pkg, d)
				}
			}
		}
		if len(deps) < 10 {
			t.Errorf("go list -deps %s named only %d packages: %q", c.pkg, len(deps), deps)
		}
	}
}
