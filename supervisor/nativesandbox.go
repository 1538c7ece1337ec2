package supervisor

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// nativeSandbox is a known runtime's own tool sandbox in one run: whether it
// runs inside the OS boundary (note says which, or why not), the arguments
// that set it, put after the agent's own so that they win, and the files
// it needs inside.
type nativeSandbox struct {
	note   string
	args   []string
	mounts []session.Mount
}

// codexRequirements is Codex's managed requirements file: a mode or an
// ACP mode switch asking for no sandbox is refused by Codex itself.
const codexRequirements = `# Written by agentconnect: Codex's own sandbox stays on inside this boundary.
allowed_sandbox_modes = ["read-only", "workspace-write"]
`

// nativeSandboxFor decides a's runtime's own sandbox. It runs where it can
// work inside the boundary and is off, with the reason, elsewhere: the OS
// boundary stays the main one either way.
func (s *Supervisor) nativeSandboxFor(a agent.Agent) (nativeSandbox, error) {
	why := nestedUnavailable(a)
	switch a.Runtime {
	case "codex":
		if why != "" {
			// Codex's sandbox is bubblewrap: where no user namespace can be
			// made it fails every command, so the boundary is the only one.
			ns := nativeSandbox{note: "off: " + why}
			if a.Strategy != strategy.Host {
				ns.args = []string{"-c", `sandbox_mode="danger-full-access"`}
			}
			return ns, nil
		}
		req, err := s.nativeFile("codex/requirements.toml", codexRequirements)
		if err != nil {
			return nativeSandbox{}, err
		}
		ns := nativeSandbox{
			note: "on: Codex's sandbox (workspace-write, no mode without it), its network through the session's proxy",
			// The network the sandbox allows is the session's, which the
			// proxy or the VM's network stack filters by the agent's policy.
			args:   []string{"-c", `sandbox_mode="workspace-write"`, "-c", "sandbox_workspace_write.network_access=true"},
			mounts: []session.Mount{{Source: req, Target: "/etc/codex/requirements.toml", ReadOnly: true}},
		}
		if a.Strategy == strategy.Microsandbox {
			// A VM's shares are directories: the file's, at /etc/codex.
			ns.note = "on: Codex's sandbox (workspace-write, no mode without it) in the VM, its network the VM's"
			ns.mounts = []session.Mount{{Source: filepath.Dir(req), Target: "/etc/codex", ReadOnly: true}}
		}
		return ns, nil
	case "claude":
		if why == "" && a.Strategy == strategy.SRT {
			why = claudeSandboxTools()
		}
		if why == "" && a.Strategy == strategy.Microsandbox && s.cfg.VM.Accelerator == "tcg" {
			why = "microsandbox under TCG: Claude Code gives its sandbox's two socat bridges about 600 ms to listen, " +
				"and an emulated VM takes 800 to 1000 ms to start them (with KVM it turns on)"
		}
		if why != "" {
			return nativeSandbox{note: "off: " + why}, nil
		}
		return s.claudeSandbox(a)
	}
	return nativeSandbox{}, nil
}

// claudeSandboxTools says which program Claude Code's sandbox needs is
// missing from the host, whose programs srt shows (Claude Code would
// refuse to start with its sandbox on, failIfUnavailable), or "".
func claudeSandboxTools() string {
	for _, p := range [][2]string{{"bwrap", "bubblewrap"}, {"socat", "socat"}} {
		if _, err := exec.LookPath(p[0]); err != nil {
			return fmt.Sprintf("%s is not installed on this host, and Claude Code's sandbox needs it (apt-get install %s)", p[0], p[1])
		}
	}
	return ""
}

// claudeManaged is the part of Claude Code's managed settings (its highest
// precedence, which no user, project or flag setting overrides) that turns
// its own sandbox on. Claude Code ignores settings it cannot parse, so they
// are marshalled from these types, never written by hand.
type claudeManaged struct {
	Sandbox struct {
		Enabled bool `json:"enabled"`
		// No start without a working sandbox, and no command outside it
		// (the model's dangerouslyDisableSandbox is ignored).
		FailIfUnavailable        bool `json:"failIfUnavailable"`
		AllowUnsandboxedCommands bool `json:"allowUnsandboxedCommands"`
		Network                  struct {
			AllowedDomains          []string `json:"allowedDomains"`
			AllowManagedDomainsOnly bool     `json:"allowManagedDomainsOnly"`
			HTTPProxyPort           int      `json:"httpProxyPort,omitempty"`
			SOCKSProxyPort          int      `json:"socksProxyPort,omitempty"`
		} `json:"network"`
	} `json:"sandbox"`
}

// claudeSandbox turns Claude Code's own sandbox on through its managed
// settings, with the agent's network policy mirrored into it: in srt its
// commands reach the network through the session's proxy (its ports on
// the sandbox's loopback), which filters by the policy; in a VM through
// Claude Code's own proxy, limited to the agent's allowed domains, behind
// the VM's network stack, which filters by the policy again.
func (s *Supervisor) claudeSandbox(a agent.Agent) (nativeSandbox, error) {
	var m claudeManaged
	m.Sandbox.Enabled, m.Sandbox.FailIfUnavailable = true, true
	m.Sandbox.Network.AllowManagedDomainsOnly = true
	m.Sandbox.Network.AllowedDomains = []string{}
	name := "claude/srt/managed-settings.json"
	note := "on: Claude Code's sandbox (fails closed, no unsandboxed commands), its network through the session's proxy"
	if a.Strategy == strategy.Microsandbox {
		// Its matcher knows host names, not ports: the VM's stack
		// still holds each allowed name to its port.
		seen := map[string]bool{}
		for _, d := range a.AllowedDomains {
			if h, _, err := net.SplitHostPort(d); err == nil {
				d = h
			}
			if !seen[d] {
				seen[d] = true
				m.Sandbox.Network.AllowedDomains = append(m.Sandbox.Network.AllowedDomains, d)
			}
		}
		name = "claude/vm/" + a.Name + "/managed-settings.json"
		note = "on: Claude Code's sandbox (fails closed, no unsandboxed commands) in the VM, its network the agent's allowed domains"
	} else {
		m.Sandbox.Network.HTTPProxyPort, m.Sandbox.Network.SOCKSProxyPort = session.SRTHTTPProxyPort, session.SRTSOCKSProxyPort
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nativeSandbox{}, err
	}
	p, err := s.nativeFile(name, string(b)+"\n")
	if err != nil {
		return nativeSandbox{}, err
	}
	ns := nativeSandbox{note: note, mounts: []session.Mount{{Source: p, Target: "/etc/claude-code/managed-settings.json", ReadOnly: true}}}
	if a.Strategy == strategy.Microsandbox {
		// A VM's shares are directories: the file's, at /etc/claude-code.
		ns.mounts = []session.Mount{{Source: filepath.Dir(p), Target: "/etc/claude-code", ReadOnly: true}}
	}
	return ns, nil
}

// nestedUnavailable says why a runtime's own bubblewrap sandbox cannot run
// inside a's boundary, or "" where it can.
func nestedUnavailable(a agent.Agent) string {
	switch a.Strategy {
	case strategy.Host:
		return "host strategy: the runtime's own settings apply (AgentConnect turns it on inside srt and microsandbox)"
	case strategy.Microsandbox:
		return "" // the image has bubblewrap, and the guest's kernel gives its user namespaces
	}
	if !a.NestedSandbox {
		return fmt.Sprintf("srt without nestedSandbox: no user namespace can be made inside (agent edit %s --nested-sandbox allows it)", a.Name)
	}
	if os.Geteuid() == 0 {
		return "srt under a root daemon: a nested bubblewrap cannot mount its /proc (run the daemon as an unprivileged user, as the system unit does)"
	}
	return ""
}

// nativeFile is a file of the runtimes' settings in the daemon home, with
// content, written when it differs.
func (s *Supervisor) nativeFile(name, content string) (string, error) {
	p := filepath.Join(s.layout.RuntimesDir(), "native", name)
	if b, err := os.ReadFile(p); err == nil && string(b) == content {
		return p, nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", fmt.Errorf("runtime settings: %w", err)
	}
	if err := atomicfile.WriteFile(p, []byte(content), 0o644); err != nil {
		return "", fmt.Errorf("runtime settings: %w", err)
	}
	return p, nil
}
