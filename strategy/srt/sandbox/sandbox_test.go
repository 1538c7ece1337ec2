package sandbox

import (
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
