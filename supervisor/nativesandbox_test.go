package supervisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// TestNativeSandboxFor: a known runtime's own sandbox is on only where it
// can run (srt with a nested sandbox under an unprivileged daemon), off
// with the reason elsewhere; Codex off inside a boundary runs without its
// sandbox rather than failing every command, and on it gets the managed
// requirements that refuse a mode without it; Claude Code on gets managed
// settings that fail closed and mirror the agent's network policy.
func TestNativeSandboxFor(t *testing.T) {
	s := &Supervisor{layout: home.Layout{Root: t.TempDir()}, cfg: config.Default()}
	tcg := &Supervisor{layout: s.layout, cfg: config.Default()}
	tcg.cfg.VM.Accelerator = "tcg"
	for _, tc := range []struct {
		a        agent.Agent
		root     bool // the case depends on the daemon's uid
		tcg      bool // VMs under TCG
		wantNote string
		wantArgs string
	}{
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.Host}, wantNote: "off: host strategy"},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.SRT}, wantNote: "off: srt without nestedSandbox", wantArgs: `-c sandbox_mode="danger-full-access"`},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.Microsandbox}, wantNote: "on: ", wantArgs: `-c sandbox_mode="workspace-write" -c sandbox_workspace_write.network_access=true`},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.Microsandbox, AllowedDomains: []string{"api.anthropic.com", "h.internal:8443", "h.internal:9443", "*.example.com"}}, wantNote: "on: "},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.Microsandbox}, tcg: true, wantNote: "off: microsandbox under TCG"},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.Microsandbox}, tcg: true, wantNote: "on: ", wantArgs: `-c sandbox_mode="workspace-write" -c sandbox_workspace_write.network_access=true`},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.SRT, NestedSandbox: true}, root: true, wantNote: "off: srt under a root daemon"},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.SRT, NestedSandbox: true}, wantNote: "on: "},
		{a: agent.Agent{Name: "x", Runtime: "claude", Strategy: strategy.SRT}, wantNote: "off: srt without nestedSandbox"},
		{a: agent.Agent{Name: "x", Runtime: "gemini", Strategy: strategy.SRT}},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.SRT, NestedSandbox: true}, root: true, wantNote: "off: srt under a root daemon", wantArgs: `-c sandbox_mode="danger-full-access"`},
		{a: agent.Agent{Name: "x", Runtime: "codex", Strategy: strategy.SRT, NestedSandbox: true}, wantNote: "on: ", wantArgs: `-c sandbox_mode="workspace-write" -c sandbox_workspace_write.network_access=true`},
	} {
		if tc.root != (os.Geteuid() == 0) && (tc.root || tc.a.NestedSandbox) {
			continue // a case for the other kind of daemon
		}
		sv := s
		if tc.tcg {
			sv = tcg
		}
		ns, err := sv.nativeSandboxFor(tc.a)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ns.note, tc.wantNote) || (tc.wantNote == "") != (ns.note == "") {
			t.Errorf("%s in %s (nested %v): note %q, want %q...", tc.a.Runtime, tc.a.Strategy, tc.a.NestedSandbox, ns.note, tc.wantNote)
		}
		if got := strings.Join(ns.args, " "); got != tc.wantArgs {
			t.Errorf("%s in %s: args %q, want %q", tc.a.Runtime, tc.a.Strategy, got, tc.wantArgs)
		}
		if !strings.HasPrefix(ns.note, "on:") {
			continue
		}
		// srt binds the file; a VM shares its directory.
		file, target := "", "/etc/codex/requirements.toml"
		if tc.a.Runtime == "claude" {
			target = "/etc/claude-code/managed-settings.json"
		}
		if tc.a.Strategy == strategy.Microsandbox {
			file, target = filepath.Base(target), filepath.Dir(target)
		}
		if len(ns.mounts) != 1 || ns.mounts[0].Target != target || !ns.mounts[0].ReadOnly {
			t.Fatalf("%s in %s: mounts %+v, want %s", tc.a.Runtime, tc.a.Strategy, ns.mounts, target)
		}
		b, err := os.ReadFile(filepath.Join(ns.mounts[0].Source, file))
		if err != nil {
			t.Fatal(err)
		}
		if tc.a.Runtime == "codex" {
			if !strings.Contains(string(b), `allowed_sandbox_modes = ["read-only", "workspace-write"]`) {
				t.Errorf("requirements: %q", b)
			}
			continue
		}
		var m claudeManaged
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("managed settings %s: %v", b, err)
		}
		sb := m.Sandbox
		if !sb.Enabled || !sb.FailIfUnavailable || sb.AllowUnsandboxedCommands || !sb.Network.AllowManagedDomainsOnly {
			t.Errorf("claude in %s: the sandbox does not fail closed: %s", tc.a.Strategy, b)
		}
		wantDomains, wantPorts := "[]", "3128 1080"
		if tc.a.Strategy == strategy.Microsandbox {
			wantDomains, wantPorts = "[api.anthropic.com h.internal *.example.com]", "0 0"
		}
		if got := fmt.Sprint(sb.Network.AllowedDomains); got != wantDomains {
			t.Errorf("claude in %s: allowed domains %s, want %s", tc.a.Strategy, got, wantDomains)
		}
		if got := fmt.Sprint(sb.Network.HTTPProxyPort, sb.Network.SOCKSProxyPort); got != wantPorts {
			t.Errorf("claude in %s: proxy ports %s, want %s", tc.a.Strategy, got, wantPorts)
		}
	}
}

// TestClaudeSandboxTools: without socat (or bwrap) on the host's PATH,
// which srt shows, Claude Code's sandbox is off with the package to
// install.
func TestClaudeSandboxTools(t *testing.T) {
	dir := t.TempDir()
	for _, p := range []string{"bwrap", "socat"} {
		os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755)
	}
	t.Setenv("PATH", dir)
	if why := claudeSandboxTools(); why != "" {
		t.Errorf("with both: %q", why)
	}
	os.Remove(filepath.Join(dir, "socat"))
	if why := claudeSandboxTools(); !strings.Contains(why, "apt-get install socat") {
		t.Errorf("without socat: %q", why)
	}
	os.Remove(filepath.Join(dir, "bwrap"))
	if why := claudeSandboxTools(); !strings.Contains(why, "apt-get install bubblewrap") {
		t.Errorf("without bwrap: %q", why)
	}
}
