package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// A start whose caller gives up before it answers (here its deadline)
// leaves nothing: the caller got an error and never learns the session's
// id. (The 500 srt bench group, on a slow day: 46 starts passed the
// client's deadline, and their sessions ran on, unknown to it.)
func TestStartItsCallerGaveUpOnLeavesNothing(t *testing.T) {
	home := newHome(t)
	d := startDaemon(t, home)
	ok(t, home, "agent", "create", "sleeper", "--", "sleep", "600")
	admin := adminClient(t, home)
	procs := leftovers.Processes(d.pid(), home)
	for range 5 {
		// A host start takes milliseconds (a shim's start, the runtime's):
		// the request reaches the daemon, the answer comes too late.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
		_, err := admin.StartSession(ctx, &adminv1.StartSessionRequest{Agent: "sleeper"})
		cancel()
		if err == nil {
			t.Fatal("a start given 2 ms answered in time: the test needs a shorter deadline")
		}
	}
	eventually(t, 30*time.Second, "no session, no process of a session", func() bool {
		return len(sessionIDs(t, home)) == 0 && len(leftovers.Processes(d.pid(), home)) <= len(procs)
	})
	if log, _ := os.ReadFile(filepath.Join(home, "daemon.log")); !strings.Contains(string(log), "start abandoned by its caller") {
		t.Errorf("no start reached the daemon before its caller gave up; daemon log:\n%s", log)
	}
}
