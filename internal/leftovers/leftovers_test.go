package leftovers

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/home"
)

// ownCgroup is this process's cgroup in the v1 hierarchy of controller.
func ownCgroup(t *testing.T, controller string) string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && parts[1] == controller {
			return filepath.Join("/sys/fs/cgroup", controller, parts[2])
		}
	}
	t.Skipf("no cgroup v1 %s hierarchy here", controller)
	return ""
}

// A daemon's parent cgroup is found wherever its hierarchy nests it, and
// another home's is not.
func TestDaemonCgroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating cgroups needs root")
	}
	homeDir, other := t.TempDir(), t.TempDir()
	var made []string
	for _, controller := range []string{"pids", "memory"} {
		dir := filepath.Join(ownCgroup(t, controller), home.Layout{Root: homeDir}.CgroupName())
		if err := os.MkdirAll(filepath.Join(dir, "0123456789abcdef"), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			os.Remove(filepath.Join(dir, "0123456789abcdef"))
			os.Remove(dir)
			os.Remove(filepath.Dir(dir)) // fails while another daemon's is inside
		})
		made = append(made, dir)
	}
	slices.Sort(made)
	if got := DaemonCgroups(homeDir); !slices.Equal(got, made) {
		t.Errorf("DaemonCgroups = %q, want %q", got, made)
	}
	if got := DaemonCgroups(other); len(got) > 0 {
		t.Errorf("DaemonCgroups of another home = %q, want none", got)
	}
	for _, dir := range made {
		os.Remove(filepath.Join(dir, "0123456789abcdef"))
		if err := os.Remove(dir); err != nil {
			t.Fatal(err)
		}
	}
	if got := DaemonCgroups(homeDir); len(got) > 0 {
		t.Errorf("DaemonCgroups after removal = %q, want none", got)
	}
}
