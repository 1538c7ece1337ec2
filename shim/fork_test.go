package shim

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
	"github.com/agentconnect-md/agentconnect/internal/testutil"
	"github.com/agentconnect-md/agentconnect/supervisor/limits"
)

// init is born in the session's cgroup, in every hierarchy, whichever way
// the host allows: a session cgroup as this host's daemon makes it (v1 here,
// v2 on a v2-only host), and a cgroup v2 directory where one is mounted
// beside v1 (CLONE_INTO_CGROUP). The shim is never left in it, and init
// waits for its command when the spawn returns.
func TestSpawnInCgroup(t *testing.T) {
	testutil.RequiresRoot(t)
	cg, mode := sessionCgroup(t, "agentconnect-test-spawn-")
	cases := map[string]cgroupfs.Cgroup{"session cgroup (" + mode + ")": cg}
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup/unified", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		v2 := filepath.Join("/sys/fs/cgroup/unified", fmt.Sprintf("agentconnect-test-spawn-%d", os.Getpid()))
		if err := os.Mkdir(v2, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(v2)
		cases["cgroup v2 beside v1"] = cgroupfs.Cgroup{Dirs: []string{v2}}
	}

	s := reapingService(t)
	devnull := devNull(t)
	own := readCgroups(t, "self")
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			logs := &recordHook{}
			s.cg, s.log = c, debugLog(logs)
			l, err := s.spawnInCgroup("/", [3]*os.File{devnull, devnull, devnull}, nil, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Abandon()
			// Returned once init waits for its command, its Go runtime
			// up (which starts threads of its own: a process that has just
			// exec'd has one): a warm boundary is ready only then.
			if threads := procThreads(t, l.PID); threads < 2 {
				t.Errorf("init (pid %d) has %d thread: its Go runtime has not started", l.PID, threads)
			}
			if len(logs.entries) > 0 {
				t.Errorf("init was moved after it started, not born in its cgroup: %v", logs.entries)
			}
			for _, d := range c.Dirs {
				procs := strings.Fields(readText(t, filepath.Join(d, "cgroup.procs")))
				if !slices.Equal(procs, []string{strconv.Itoa(l.PID)}) {
					t.Errorf("%s/cgroup.procs = %v, want init (%d) alone", d, procs, l.PID)
				}
			}
			if got := readCgroups(t, "self"); got != own {
				t.Errorf("the shim's cgroups changed:\n%s\nwere\n%s", got, own)
			}
		})
	}
}

// A start that knows its command forks it in the session's cgroup with no
// init between, with exactly the environment it was given, in its own
// process group. (One whose command is missing goes through init, which
// says why: strategy/host's TestExecErrors, with the shim's binary.)
func TestStartInCgroupForksTheCommand(t *testing.T) {
	testutil.RequiresRoot(t)
	cg, _ := sessionCgroup(t, "agentconnect-test-start-")
	logs := &recordHook{}
	s := reapingService(t)
	s.cg, s.log = cg, debugLog(logs)
	devnull := devNull(t)
	stdio := [3]*os.File{devnull, devnull, devnull}

	env := []string{"PATH=/usr/bin:/bin", "ONLY=this"}
	l, execErr, err := s.startInCgroup([]string{"sleep", "60"}, "/", env, stdio, nil, nil, nil)
	if err != nil || execErr != "" {
		t.Fatalf("startInCgroup = %v, exec error %q", err, execErr)
	}
	defer func() {
		syscall.Kill(l.PID, syscall.SIGKILL)
		<-l.Exited
	}()
	if l.syncW != nil || len(logs.entries) > 0 {
		t.Errorf("the command went through init: %v", logs.entries)
	}
	for _, d := range cg.Dirs {
		if procs := strings.Fields(readText(t, filepath.Join(d, "cgroup.procs"))); !slices.Equal(procs, []string{strconv.Itoa(l.PID)}) {
			t.Errorf("%s/cgroup.procs = %v, want the command (%d) alone", d, procs, l.PID)
		}
	}
	if got := strings.Split(strings.TrimRight(readText(t, fmt.Sprintf("/proc/%d/environ", l.PID)), "\x00"), "\x00"); !slices.Equal(got, env) {
		t.Errorf("environment = %q, want %q", got, env)
	}
	if pgid, err := syscall.Getpgid(l.PID); err != nil || pgid != l.PID {
		t.Errorf("process group = %d, %v; want its own (%d)", pgid, err, l.PID)
	}
}

// sessionCgroup makes a session cgroup as this host's daemon would, under a
// parent named prefix and this process's pid, and returns it with the
// host's cgroup mode; the test removes both.
func sessionCgroup(t *testing.T, prefix string) (cgroupfs.Cgroup, string) {
	t.Helper()
	m, sup := limits.Setup(prefix + strconv.Itoa(os.Getpid()))
	if !sup.Available {
		t.Fatalf("cgroups unavailable as root: %s", sup.Reason)
	}
	t.Cleanup(m.Close)
	cg, err := m.Create("s1", session.Limits{Pids: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Remove() })
	return cg, sup.Mode
}

// reapingService is a service whose reaper collects its children's exits
// for the test's length.
func reapingService(t *testing.T) *service {
	s := &service{reaper: newReaper()}
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	t.Cleanup(func() { signal.Stop(sigchld) })
	go s.reaper.run(sigchld)
	return s
}

func devNull(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// debugLog logs at debug level into logs.
func debugLog(logs *recordHook) *logrus.Entry {
	logger := logrus.New()
	logger.SetLevel(logrus.DebugLevel)
	logger.AddHook(logs)
	return logrus.NewEntry(logger)
}

// recordHook keeps what is logged at debug level: the fallback's message.
type recordHook struct{ entries []string }

func (h *recordHook) Levels() []logrus.Level { return []logrus.Level{logrus.DebugLevel} }
func (h *recordHook) Fire(e *logrus.Entry) error {
	h.entries = append(h.entries, e.Message+": "+fmt.Sprint(e.Data[logrus.ErrorKey]))
	return nil
}

func readCgroups(t *testing.T, pid string) string {
	return readText(t, "/proc/"+pid+"/cgroup")
}

func readText(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// With premount, the command starts in a mount namespace of its own in
// which premount mounted, and the host sees none of it; a premount that
// fails starts nothing, not even through init.
func TestStartInCgroupPremount(t *testing.T) {
	testutil.RequiresRoot(t)
	cg, _ := sessionCgroup(t, "agentconnect-test-premount-")
	logs := &recordHook{}
	s := reapingService(t)
	s.cg, s.log = cg, debugLog(logs)
	devnull := devNull(t)
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	target := filepath.Join(dir, "covered")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/bin:/bin"}
	premount := func() error { return unix.Mount("tmpfs", target, "tmpfs", 0, "size=1m") }
	l, execErr, err := s.startInCgroup([]string{"cat", "/proc/self/mountinfo"}, "/", env, [3]*os.File{devnull, out, devnull}, nil, nil, premount)
	if err != nil || execErr != "" {
		t.Fatalf("startInCgroup with premount = %v, exec error %q", err, execErr)
	}
	<-l.Exited
	if !strings.Contains(readText(t, out.Name()), " "+target+" ") {
		t.Errorf("the command's mounts lack the premount's tmpfs at %s", target)
	}
	if strings.Contains(readText(t, "/proc/self/mountinfo"), " "+target+" ") {
		t.Errorf("the premount's tmpfs at %s reached the host's namespace", target)
	}

	refused := errors.New("a protected name changed")
	_, _, err = s.startInCgroup([]string{"sleep", "60"}, "/", env, [3]*os.File{devnull, devnull, devnull}, nil, nil, func() error { return refused })
	var pe *PremountError
	if !errors.As(err, &pe) || !errors.Is(err, refused) {
		t.Fatalf("startInCgroup with a failing premount = %v, want a PremountError wrapping it", err)
	}
	if len(logs.entries) > 0 {
		t.Errorf("a failed premount went on through init: %v", logs.entries)
	}
	if procs := strings.Fields(readText(t, filepath.Join(cg.Dirs[0], "cgroup.procs"))); len(procs) != 0 {
		t.Errorf("the session's cgroup holds %v after a failed premount", procs)
	}
}

// procThreads is the number of threads of process pid.
func procThreads(t *testing.T, pid int) int {
	t.Helper()
	for _, line := range strings.Split(readText(t, fmt.Sprintf("/proc/%d/status", pid)), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("/proc/%d/status: %q", pid, line)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no Threads line", pid)
	return 0
}
