package agent

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzValidate: an agent made of arbitrary names, paths, mounts, env and
// domains is accepted or refused with an error, never a panic; one it
// accepts has a valid name, a workspace inside its directory, mounts with
// absolute clean paths outside the daemon home, env entries with a
// variable name and no NUL, and domains that validate again unchanged.
func FuzzValidate(f *testing.F) {
	f.Add("claude", "workspace", "", "/srv/data:/data:rw", "K=V", "api.example.com", "*.example.org:8443", "echo hi")
	f.Add("a", "../x", "", "type=bind,src=/srv,dst=/srv,readonly", "PATH=/bin", "127.0.0.1:8080", "", "x")
	f.Add("-bad", "agent.json/x", "/", "/proc:/proc", "=v", "*", "http://x", "")
	f.Add("x.y_z", "ws/./a", "/tmp", "/tmp/x:/tmp/x:ro", "A", "xn--bcher-kva.example", "[::1]:443", "\x00")
	f.Fuzz(func(t *testing.T, name, workspace, shared, mount, env, allow, deny, command string) {
		home := t.TempDir()
		daemonHome := filepath.Join(home, "daemon")
		agentDir := filepath.Join(daemonHome, "agents", "0123456789abcdef")
		a := Agent{Name: name, Workspace: workspace, SharedWorkspace: shared, Command: strings.Fields(command)}
		if len(a.Command) == 0 && command != "" {
			a.Command = []string{command}
		}
		if mount != "" {
			if m, err := ParseMount(mount); err == nil {
				a.Mounts = []Mount{m}
			}
		}
		if env != "" {
			a.Env = []string{env}
		}
		if allow != "" {
			a.AllowedDomains = []string{allow}
		}
		if deny != "" {
			a.DeniedDomains = []string{deny}
		}
		if err := Validate(&a, daemonHome, agentDir); err != nil {
			if err.Error() == "" {
				t.Fatal("a refusal without a message")
			}
			return
		}
		if !ValidName(a.Name) {
			t.Fatalf("accepted name %q", a.Name)
		}
		if a.SharedWorkspace == "" {
			if ws, err := ResolveInside(agentDir, a.Workspace); err != nil || !Within(agentDir, ws) || ws == agentDir {
				t.Fatalf("accepted workspace %q resolves to %q (%v)", a.Workspace, ws, err)
			}
		}
		for _, m := range a.Mounts {
			for _, p := range []string{m.Source, m.Target} {
				if !filepath.IsAbs(p) || filepath.Clean(p) != p {
					t.Fatalf("accepted mount %+v: %q is not absolute and clean", m, p)
				}
			}
			if Within(daemonHome, m.Source) || Within(m.Source, daemonHome) {
				t.Fatalf("accepted mount %+v touches the daemon home", m)
			}
		}
		for _, kv := range a.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
				t.Fatalf("accepted env %q", kv)
			}
		}
		for _, d := range append(append([]string{}, a.AllowedDomains...), a.DeniedDomains...) {
			if again, err := ValidateDomain(d); err != nil || again != d {
				t.Fatalf("accepted domain %q validates again to %q, %v", d, again, err)
			}
		}
	})
}
