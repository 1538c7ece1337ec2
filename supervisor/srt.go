package supervisor

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// sandboxSpec is what the shim needs to build a's srt boundary.
func (s *Supervisor) sandboxSpec(a agent.Agent, agentDir string) *session.Sandbox {
	sb := &session.Sandbox{
		DaemonHome:      s.opts.Home,
		Hidden:          homesToHide(),
		AgentDir:        agentDir,
		SharedWorkspace: a.SharedWorkspace != "",
		AllowedDomains:  a.AllowedDomains,
		DeniedDomains:   a.DeniedDomains,
		NestedSandbox:   a.NestedSandbox,
		Resolver:        s.cfg.SRT.Resolver,
		TrustedCAPEM:    s.cfg.TrustedCAPEM,
		Credentials:     credentialPaths(a),
	}
	for _, m := range a.Mounts {
		sb.Mounts = append(sb.Mounts, session.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	return sb
}

// credentialPaths are the daemon user's credential files that exist and
// that a has not opted back in, resolved.
func credentialPaths(a agent.Agent) []string {
	home, err := os.UserHomeDir()
	if err != nil {
		return nil
	}
	var paths []string
	for name, rel := range agent.Credentials {
		if slices.Contains(a.AllowCredentials, name) {
			continue
		}
		p, err := filepath.EvalSymlinks(filepath.Join(home, rel))
		if err == nil {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	return paths
}

// exposedCredentials are the credential files of paths that a's mounts or
// shared workspace hold, each with the directory that holds it.
func exposedCredentials(a agent.Agent, paths []string) (exposed []string) {
	roots := []string{a.SharedWorkspace}
	for _, m := range a.Mounts {
		roots = append(roots, m.Source)
	}
	for _, root := range roots {
		if root == "" {
			continue
		}
		r, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		for _, p := range paths {
			if agent.Within(r, p) {
				exposed = append(exposed, fmt.Sprintf("%s (in %s)", p, root))
			}
		}
	}
	return exposed
}

// systemDirs are never hidden, whoever has them as a home (sync's is /bin).
var systemDirs = map[string]bool{
	"/": true, "/bin": true, "/sbin": true, "/usr": true, "/etc": true, "/dev": true, "/proc": true,
	"/sys": true, "/var": true, "/lib": true, "/lib64": true, "/run": true, "/tmp": true, "/nonexistent": true,
}

// homesToHide lists the daemon user's home and the homes of the machine's
// people (root and uids from 1000) from /etc/passwd: no sandbox sees them.
func homesToHide() []string {
	seen := map[string]bool{}
	var homes []string
	add := func(h string) {
		h = filepath.Clean(h)
		if h == "." || systemDirs[h] || strings.HasPrefix(h, "/usr/") || strings.HasPrefix(h, "/proc/") || seen[h] {
			return
		}
		seen[h] = true
		homes = append(homes, h)
	}
	if h, err := os.UserHomeDir(); err == nil {
		add(h)
	}
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return homes
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 7 {
			continue
		}
		uid, err := strconv.Atoi(fields[2])
		if err != nil || (uid != 0 && uid < 1000) || uid == 65534 {
			continue
		}
		add(fields[5])
	}
	return homes
}
