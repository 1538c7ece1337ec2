package supervisor

import (
	"fmt"
	"os"
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
		if why != "" {
			return nativeSandbox{note: "off: " + why}, nil
		}
		return nativeSandbox{note: "off: this version does not turn Claude Code's own sandbox on yet"}, nil
	}
	return nativeSandbox{}, nil
}

// nestedUnavailable says why a runtime's own bubblewrap sandbox cannot run
// inside a's boundary, or "" where it can.
func nestedUnavailable(a agent.Agent) string {
	switch a.Strategy {
	case strategy.Host:
		return "host strategy: the runtime's own settings apply (AgentConnect turns it on inside srt and microsandbox)"
	case strategy.Microsandbox:
		return "" // the image has bubblewrap, and the runtime is root in its own kernel
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
