package cgroupfs_test

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
	"github.com/agentconnect-md/agentconnect/internal/testutil"
	"github.com/agentconnect-md/agentconnect/supervisor/limits"
)

// A thread that enters a session's cgroup forks a process born in it, and
// is back where it was after: the process's cgroup never lists the caller.
func TestEnterThread(t *testing.T) {
	cg, sup := sessionCgroup(t, "agentconnect-test-thread-", 32)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := readFile(t, "/proc/thread-self/cgroup")
	leave, err := cg.EnterThread()
	if sup.Mode == "v2" {
		// A thread cannot move alone into a v2 domain: nothing moved.
		if err == nil {
			leave()
			t.Fatal("EnterThread into a cgroup v2 domain succeeded")
		}
		if got := readFile(t, "/proc/thread-self/cgroup"); got != before {
			t.Fatalf("a failed EnterThread moved the thread: %q, was %q", got, before)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	tid := strconv.Itoa(unix.Gettid())
	for _, d := range cg.Dirs {
		if !slices.Contains(strings.Fields(readFile(t, d+"/tasks")), tid) {
			t.Errorf("thread %s is not in %s/tasks after EnterThread", tid, d)
		}
	}
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	if err != nil {
		leave()
		t.Fatal(err)
	}
	go p.Wait()
	if err := leave(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, "/proc/thread-self/cgroup"); got != before {
		t.Errorf("after leave the thread is in\n%s\nwas in\n%s", got, before)
	}
	for _, d := range cg.Dirs {
		procs := strings.Fields(readFile(t, d+"/cgroup.procs"))
		if !slices.Equal(procs, []string{strconv.Itoa(p.Pid)}) {
			t.Errorf("%s/cgroup.procs = %v, want only the child %d", d, procs, p.Pid)
		}
	}
	if err := cg.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cg.Remove(); err != nil {
		t.Fatal(err)
	}
}

// sessionCgroup makes a session's cgroup with a pids limit, as the daemon
// would, under a parent named prefix and the test's pid; it goes when the
// test ends. Root only.
func sessionCgroup(t *testing.T, prefix string, pids int64) (cgroupfs.Cgroup, limits.Support) {
	t.Helper()
	testutil.RequiresRoot(t)
	m, sup := limits.Setup(prefix + strconv.Itoa(os.Getpid()))
	if !sup.Available {
		t.Fatalf("cgroups unavailable as root: %s", sup.Reason)
	}
	t.Cleanup(m.Close)
	cg, err := m.Create("s1", session.Limits{Pids: pids})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Remove() })
	return cg, sup
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
