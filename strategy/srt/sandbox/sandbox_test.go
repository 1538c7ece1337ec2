package sandbox

import (
	"fmt"
	"os"
	"testing"
)

// argsHave reports whether args hold the sequence want.
func argsHave(args []string, want ...string) bool {
	for i := 0; i+len(want) <= len(args); i++ {
		match := true
		for j, w := range want {
			if args[i+j] != w {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

func TestMakeRoomSplitsReadOnlyParent(t *testing.T) {
	b := &builder{}
	// /usr/share exists on the host; /usr/share/agentconnect-test-tools does
	// not: /usr/share becomes a tmpfs holding its entries again.
	target := "/usr/share/agentconnect-test-tools/bin"
	if err := b.makeRoom(target, Config{}); err != nil {
		t.Fatal(err)
	}
	if !argsHave(b.args, "--tmpfs", "/usr/share") || len(b.readOnlyLater) != 1 || b.readOnlyLater[0] != "/usr/share" {
		t.Fatalf("args %q (read-only later: %q) do not split /usr/share", b.args, b.readOnlyLater)
	}
	entries, _ := os.ReadDir("/usr/share")
	if len(entries) > 0 {
		p := "/usr/share/" + entries[0].Name()
		if !argsHave(b.args, "--ro-bind", p, p) && !argsHave(b.args, p) {
			t.Errorf("args do not bind %s back", p)
		}
	}
	// An existing target needs no room; one under /tmp has a tmpfs already.
	b = &builder{}
	b.makeRoom("/usr", Config{})
	b.makeRoom("/tmp/x/y", Config{})
	if len(b.args) != 0 {
		t.Errorf("args %q, want none", b.args)
	}
}

// TestViewInside: where the view shows a host path: through the system's
// read-only view unless hidden, and through each bind that holds it, minus
// what is covered inside.
func TestViewInside(t *testing.T) {
	v := view{
		tops:    []string{"/usr", "/srv", "/var"},
		hidden:  []string{"/var/tmp", "/srv/home"},
		binds:   []bind{{"/srv/home/agents/a/workspace", "/srv/home/agents/a/workspace"}, {"/srv/data", "/data"}},
		covered: []string{"/data/.ssh"},
	}
	for p, want := range map[string]string{
		"/usr/local/s.sock":                   "[/usr/local/s.sock]",
		"/var/tmp/s.sock":                     "[]",
		"/tmp/s.sock":                         "[]",
		"/srv/home/other/s.sock":              "[]",
		"/srv/home/agents/a/workspace/s.sock": "[/srv/home/agents/a/workspace/s.sock]",
		"/srv/data/s.sock":                    "[/data/s.sock /srv/data/s.sock]",
		"/srv/data/.ssh/agent.sock":           "[/srv/data/.ssh/agent.sock]",
		"/srv/homestead/s.sock":               "[/srv/homestead/s.sock]",
	} {
		if got := fmt.Sprint(v.inside(p)); got != want {
			t.Errorf("inside(%s) = %s, want %s", p, got, want)
		}
	}
}
