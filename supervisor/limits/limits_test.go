package limits

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/testutil"
)

// setupAsRoot is Setup for a test that needs cgroups: it skips when not
// root and fails when root cannot have them.
func setupAsRoot(t *testing.T, name string) *Manager {
	t.Helper()
	testutil.RequiresRoot(t)
	m, sup := Setup(name)
	if !sup.Available {
		t.Fatalf("cgroups unavailable as root: %s", sup.Reason)
	}
	return m
}

func TestSessionCgroupLimits(t *testing.T) {
	m := setupAsRoot(t, "agentconnect-test-"+strconv.Itoa(os.Getpid()))
	cg, err := m.Create("s1", session.Limits{Pids: 32, MemoryMiB: 64, CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Remove()
	want := map[string]string{
		"pids.max":              "32",
		"memory.limit_in_bytes": strconv.Itoa(64 << 20), // v1
		"memory.max":            strconv.Itoa(64 << 20), // v2
		"cpu.cfs_quota_us":      "100000",               // v1
		"cpu.max":               "100000 100000",        // v2
	}
	found := 0
	for _, d := range cg.Dirs {
		for file, v := range want {
			data, err := os.ReadFile(filepath.Join(d, file))
			if err != nil {
				continue
			}
			found++
			if got := strings.TrimSpace(string(data)); got != v {
				t.Errorf("%s/%s = %q, want %q", d, file, got, v)
			}
		}
	}
	if found < 3 {
		t.Errorf("found %d of the pids, memory and cpu limit files in %v", found, cg.Dirs)
	}

	// A warm boundary's build yields the CPU, and a claim gives it back.
	for _, background := range []bool{true, false} {
		if err := cg.SetBackground(background); err != nil {
			t.Fatal(err)
		}
		weights := map[string]string{"cpu.shares": "1024", "cpu.weight": "100"}
		if background {
			weights = map[string]string{"cpu.shares": "2", "cpu.weight": "1"}
		}
		set := 0
		for _, d := range cg.Dirs {
			for file, v := range weights {
				if data, err := os.ReadFile(filepath.Join(d, file)); err == nil {
					set++
					if got := strings.TrimSpace(string(data)); got != v {
						t.Errorf("SetBackground(%v): %s/%s = %q, want %q", background, d, file, got, v)
					}
				}
			}
		}
		if set == 0 {
			t.Errorf("SetBackground(%v): no cpu weight file in %v", background, cg.Dirs)
		}
	}

	// A process added to the cgroup is listed, killed and the cgroup removed.
	p, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	go p.Wait()
	if err := cg.Add(p.Pid); err != nil {
		t.Fatal(err)
	}
	pids, err := cg.Procs()
	if err != nil || len(pids) != 1 || pids[0] != p.Pid {
		t.Fatalf("Procs = %v, %v; want [%d]", pids, err, p.Pid)
	}
	if err := cg.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cg.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range cg.Dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Remove", d)
		}
	}
	// The daemon's parent directory (agentconnect-test-PID) stays for the
	// next session, until the daemon closes.
	m.Close()
	for _, d := range cg.Dirs {
		if _, err := os.Stat(filepath.Dir(d)); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Close", filepath.Dir(d))
		}
	}
}

func TestSetupUnprivileged(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("checks the reason an unprivileged daemon gets; runs when not root")
	}
	if _, sup := Setup("agentconnect-test"); !sup.Available && !strings.Contains(sup.Reason, "root") {
		t.Errorf("reason %q does not say how to get cgroups", sup.Reason)
	}
}

// Close takes away every level of the daemon's parent cgroup that Setup's
// name made, the shared top one included, once nothing is inside.
func TestCloseRemovesEveryLevelOfTheParent(t *testing.T) {
	top := "agentconnect-test-close-" + strconv.Itoa(os.Getpid())
	m := setupAsRoot(t, top+"/home1")
	if len(m.parentDirs) == 0 {
		t.Fatal("no parent cgroup directories")
	}
	var tops []string
	for _, d := range m.parentDirs {
		if filepath.Base(filepath.Dir(d)) != top {
			t.Fatalf("parent %s is not under %s", d, top)
		}
		tops = append(tops, filepath.Dir(d))
	}
	m.Close()
	for _, d := range append(m.parentDirs, tops...) {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is left after Close: %v", d, err)
			os.Remove(d) // inner levels first, so the test leaves nothing either
		}
	}
}

// A session's cgroup is where Dirs says before it is made (the record names
// it while the shim starts), even once the daemon has been moved to another
// cgroup since Setup.
func TestCreateWhereDirsSays(t *testing.T) {
	m := setupAsRoot(t, "agentconnect-test-dirs-"+strconv.Itoa(os.Getpid()))
	defer m.Close()
	check := func(id string) {
		t.Helper()
		want := m.Dirs(id)
		cg, err := m.Create(id, session.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Remove()
		if !slices.Equal(cg.Dirs, want) {
			t.Errorf("Create(%s) made %v, Dirs said %v", id, cg.Dirs, want)
		}
		for _, d := range want {
			if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err != nil {
				t.Errorf("%s is not a cgroup: %v", d, err)
			}
		}
	}
	check("s1")

	// Move this process into a sibling of the parent in one hierarchy.
	own := filepath.Dir(m.parentDirs[0])
	moved := filepath.Join(own, "agentconnect-test-moved-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(moved, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(moved)
	self := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(filepath.Join(moved, "cgroup.procs"), self, 0); err != nil {
		t.Fatal(err)
	}
	defer os.WriteFile(filepath.Join(own, "cgroup.procs"), self, 0)
	check("s2")
}

// On a v1 host a session's directories come in the order the daemons before
// this one (with containerd's cgroups library) recorded them: a session whose
// start a killed daemon left is found where its record says.
func TestV1DirsInRecordedOrder(t *testing.T) {
	m := setupAsRoot(t, "agentconnect-test-order-"+strconv.Itoa(os.Getpid()))
	defer m.Close()
	if m.mode == unified {
		t.Skip("a v2 host has one directory per session")
	}
	var got []string
	for _, d := range m.Dirs("s1") {
		rel, err := filepath.Rel(cgroupRoot, d)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, strings.SplitN(rel, "/", 2)[0])
	}
	if want := []string{"pids", "cpu", "cpuacct", "memory"}; !slices.Equal(got, want) {
		t.Errorf("a session's directories are in the hierarchies %v, want %v", got, want)
	}
}

// A v2 hierarchy that cannot give a session the pids controller (here the
// unified one of a hybrid host, whose controllers are all v1's) refuses the
// cgroup rather than make one without its limit, and leaves no session
// directory.
func TestV2WithoutControllersRefused(t *testing.T) {
	testutil.RequiresRoot(t)
	if hostMode() != hybrid {
		t.Skip("needs a hybrid host's unified hierarchy, which has no pids controller")
	}
	root := filepath.Join(cgroupRoot, "unified")
	if data, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err != nil || strings.Contains(string(data), "pids") {
		t.Skipf("the unified hierarchy offers the pids controller (%q, %v)", data, err)
	}
	top := "agentconnect-test-v2-" + strconv.Itoa(os.Getpid())
	m := &Manager{mode: unified, parent: "/" + top + "/home1", v2Root: root}
	defer func() {
		os.Remove(filepath.Join(root, top, "home1"))
		os.Remove(filepath.Join(root, top))
	}()
	_, err := m.Create("s1", session.Limits{Pids: 32, MemoryMiB: 64, CPUs: 1})
	if err == nil {
		t.Fatal("Create made a v2 cgroup without the pids controller")
	}
	t.Logf("refused: %v", err)
	if _, serr := os.Stat(filepath.Join(root, top, "home1", "s1")); !os.IsNotExist(serr) {
		t.Errorf("the refused cgroup's directory is left: %v", serr)
	}
}
