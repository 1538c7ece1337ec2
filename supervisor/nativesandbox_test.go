package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// TestNativeSandboxFor: a known runtime's own sandbox is on only where it
// can run (srt with a nested sandbox under an unprivileged daemon), off
// with the reason elsewhere; Codex off inside a boundary runs without its
// sandbox rather than failing every command, and on it gets the managed
// requirements that refuse a mode without it.
func TestNativeSandboxFor(t *testing.T) {
	s := &Supervisor{layout: home.Layout{Root: t.TempDir()}}
	for _, tc := range []struct {
		a        agent.Agent
		root     bool // the case depends on the daemon's uid
		wantNote string
		wantArgs string
	}{
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.Host}, wantNote: "off: host strategy"},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.SRT}, wantNote: "off: srt without nestedSandbox", wantArgs: `-c sandbox_mode="danger-full-access"`},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.Microsandbox}, wantNote: "on: ", wantArgs: `-c sandbox_mode="workspace-write" -c sandbox_workspace_write.network_access=true`},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.Microsandbox}, wantNote: "off: this version"},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.SRT}, wantNote: "off: srt without nestedSandbox"},
		{a: agent.Agent{Name: "x", Runtime: "gemini", Strategy: strategy.SRT}},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.SRT, NestedSandbox: true}, root: true, wantNote: "off: srt under a root daemon", wantArgs: `-c sandbox_mode="danger-full-access"`},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.SRT, NestedSandbox: true}, wantNote: "on: ", wantArgs: `-c sandbox_mode="workspace-write" -c sandbox_workspace_write.network_access=true`},
	} {
		if tc.root != (os.Geteuid() == 0) && (tc.root || tc.a.NestedSandbox) {
			continue // a case for the other kind of daemon
		}
		ns, err := s.nativeSandboxFor(tc.a)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ns.note, tc.wantNote) || (tc.wantNote == "") != (ns.note == "") {
			t.Errorf("%s in %s (nested %v): note %q, want %q...", tc.a.Runtime, tc.a.Strategy, tc.a.NestedSandbox, ns.note, tc.wantNote)
		}
		if got := strings.Join(ns.args, " "); got != tc.wantArgs {
			t.Errorf("%s in %s: args %q, want %q", tc.a.Runtime, tc.a.Strategy, got, tc.wantArgs)
		}
		if strings.HasPrefix(ns.note, "on:") {
			// srt binds the file; a VM shares its directory.
			file, target := "", "/etc/codex/requirements.toml"
			if tc.a.Strategy == strategy.Microsandbox {
				file, target = "requirements.toml", "/etc/codex"
			}
			if len(ns.mounts) != 1 || ns.mounts[0].Target != target || !ns.mounts[0].ReadOnly {
				t.Fatalf("mounts: %+v", ns.mounts)
			}
			if b, err := os.ReadFile(filepath.Join(ns.mounts[0].Source, file)); err != nil || !strings.Contains(string(b), `allowed_sandbox_modes = ["read-only", "workspace-write"]`) {
				t.Errorf("requirements: %q, %v", b, err)
			}
		}
	}
}
