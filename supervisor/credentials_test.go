package supervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// TestExposedCredentials: a mount or shared workspace that holds the
// daemon user's credential files shows them (microsandbox then refuses);
// an opted-in one, or a narrower mount, does not.
func TestExposedCredentials(t *testing.T) {
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, ".ssh"), 0o700)
	os.WriteFile(filepath.Join(home, ".netrc"), []byte("x"), 0o600)
	os.MkdirAll(filepath.Join(home, "src"), 0o700)
	t.Setenv("HOME", home)
	wide := agent.Agent{Mounts: []agent.Mount{{Source: home, Target: "/mnt/h"}}}
	got := exposedCredentials(wide, credentialPaths(wide))
	if len(got) != 2 || !strings.Contains(strings.Join(got, " "), ".ssh") || !strings.Contains(strings.Join(got, " "), ".netrc") {
		t.Errorf("a mount of the home: %v, want .netrc and .ssh", got)
	}
	wide.AllowCredentials = []string{"ssh", "netrc"}
	if got := exposedCredentials(wide, credentialPaths(wide)); len(got) != 0 {
		t.Errorf("with both opted in: %v", got)
	}
	narrow := agent.Agent{SharedWorkspace: filepath.Join(home, "src")}
	if got := exposedCredentials(narrow, credentialPaths(narrow)); len(got) != 0 {
		t.Errorf("a narrower workspace: %v", got)
	}
}
