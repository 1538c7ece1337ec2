package supervisor

import (
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// TestSameBoundary: a warm run is claimed only when all that it was
// prepared from is what a start now builds; a claim binds only the command,
// the env, and keeps the run's cgroup.
func TestSameBoundary(t *testing.T) {
	base := func() session.Spec {
		return session.Spec{
			Strategy: "srt", Command: []string{"runtime"}, Env: []string{"A=1"}, Workspace: "/w", Home: "/h",
			Cgroup:  []string{"/sys/fs/cgroup/x"},
			Sandbox: &session.Sandbox{AllowedDomains: []string{"example.com"}, Mounts: []session.Mount{{Source: "/s", Target: "/t"}}},
		}
	}
	claim := base()
	claim.Command, claim.CommandOverride, claim.Env, claim.Cgroup = []string{"sh", "-c", "x"}, true, []string{"A=2", "S=placeholder"}, nil
	if !sameBoundary(base(), claim) {
		t.Error("a claim with its own command, env and no cgroup yet does not match the warm run")
	}
	for name, change := range map[string]func(*session.Spec){
		"a domain":         func(s *session.Spec) { s.Sandbox.AllowedDomains = append(s.Sandbox.AllowedDomains, "other.com") },
		"a mount":          func(s *session.Spec) { s.Sandbox.Mounts[0].ReadOnly = true },
		"the workspace":    func(s *session.Spec) { s.Workspace = "/other" },
		"a limit":          func(s *session.Spec) { s.Limits.Pids = 100 },
		"the host user":    func(s *session.Spec) { s.RunAs = &session.RunAs{Name: "agentconnect", UID: 999} },
		"nested sandbox":   func(s *session.Spec) { s.Sandbox.NestedSandbox = true },
		"the output limit": func(s *session.Spec) { s.OutputLimitMiB = 1 },
	} {
		now := base()
		change(&now)
		if sameBoundary(base(), now) {
			t.Errorf("a warm run matches a start whose %s changed", name)
		}
	}

	// A warm VM was placed (its directories, its vsock CID); a start's
	// spec is not yet. All else of the VM must match.
	vmSpec := func() session.Spec {
		s := base()
		s.Strategy = "microsandbox"
		s.VM = &session.VM{CPUs: 1, MemoryMiB: 512, ImageDigest: "sha256:a", Shares: []session.VMShare{{Tag: "workspace", Source: "/w", Target: "/w"}}}
		return s
	}
	warm := vmSpec()
	warm.VM.Dir, warm.VM.RunDir, warm.VM.CID = "/vms/warm/id", "/run/warm/1", 77
	if !sameBoundary(warm, vmSpec()) {
		t.Error("a placed warm VM does not match a start of the same agent")
	}
	if warm.VM.Dir == "" || warm.VM.CID != 77 {
		t.Error("sameBoundary changed the warm VM's placement")
	}
	for name, change := range map[string]func(*session.VM){
		"the image":        func(v *session.VM) { v.ImageDigest = "sha256:b" },
		"the memory":       func(v *session.VM) { v.MemoryMiB = 1024 },
		"the TCG cache":    func(v *session.VM) { v.TCGCacheMiB = 64 },
		"a share":          func(v *session.VM) { v.Shares[0].ReadOnly = true },
		"the transport":    func(v *session.VM) { v.Transport = "vsock" },
		"the hidden homes": func(v *session.VM) { v.Hidden = []string{"/home/x"} },
	} {
		now := vmSpec()
		change(now.VM)
		if sameBoundary(warm, now) {
			t.Errorf("a warm VM matches a start whose %s changed", name)
		}
	}
}
