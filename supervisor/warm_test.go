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
}
