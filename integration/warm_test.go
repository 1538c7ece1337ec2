package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apisession "github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// warmShims lists the warm boundaries of the daemon at h that are ready:
// session directories whose record is warm, with a live shim.
func warmShims(h string) map[string]int {
	layout := home.Layout{Root: h}
	entries, _ := os.ReadDir(layout.SessionsDir())
	found := map[string]int{}
	for _, e := range entries {
		dir := apisession.Dir(layout.SessionDir(e.Name()))
		rec, err := dir.ReadRecord()
		if err != nil || !rec.Warm {
			continue
		}
		if boot, _ := dir.ReadBootstrap(); boot != nil && procstat.Alive(boot.PID, boot.StartTime) {
			found[rec.ID] = boot.PID
		}
	}
	return found
}

// waitWarm waits until agent w has n warm boundaries ready (waitWarmAgent).
func waitWarm(t *testing.T, h string, n int) map[string]int {
	t.Helper()
	return waitWarmAgent(t, h, "w", n)
}

// waitWarmAgent waits until the agent, the home's only one with warm
// boundaries, has n ready, as agent show says and as the home holds them,
// and returns them.
func waitWarmAgent(t *testing.T, h, name string, n int) map[string]int {
	t.Helper()
	var w map[string]int
	// A warm VM boots under TCG in about 5 s, one after the other.
	eventually(t, 2*time.Minute, "warm boundaries ready", func() bool {
		var a struct {
			WarmReady int `json:"warmReady"`
		}
		okJSON(t, h, &a, "agent", "show", name)
		w = warmShims(h)
		return a.WarmReady == n && len(w) == n
	})
	return w
}

// sessionIDs are the ids session ls shows.
func sessionIDs(t *testing.T, h string) []string {
	t.Helper()
	var list []session
	okJSON(t, h, &list, "session", "ls")
	var ids []string
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	return ids
}

// execWarm runs exec --keep with args and returns its output and the new
// session's id.
func execWarm(t *testing.T, h string, args ...string) (string, string) {
	t.Helper()
	before := sessionIDs(t, h)
	out := ok(t, h, append([]string{"exec", "--keep"}, args...)...)
	for _, id := range sessionIDs(t, h) {
		if !slices.Contains(before, id) {
			return out, id
		}
	}
	t.Fatalf("exec %v: no new session", args)
	return "", ""
}

// TestWarmBoundaries: an agent's warm boundaries (a host process, an srt
// sandbox, a booted VM) are ready before any session; a session claims one
// and gets its own command and env; the pool refills with new ones (a
// claimed boundary is never used again); an edit of the agent replaces
// them; a supervisor SIGKILL and restart replaces them; removing the
// agent, and stopping the daemon, leave nothing.
func TestWarmBoundaries(t *testing.T) {
	requireRoot(t)
	requireBwrap(t)
	for _, strategy := range []string{"host", "srt", "microsandbox"} {
		t.Run(strategy, func(t *testing.T) {
			var h string
			var d *daemon
			if strategy == "microsandbox" {
				requireMicrosandbox(t)
				h, d = startVMDaemon(t, "")
			} else {
				h = newHome(t)
				d = startDaemon(t, h)
			}
			procs := leftovers.NewBaseline(leftovers.Processes(d.pid(), h))
			ok(t, h, "agent", "create", "w", "--strategy", strategy, "--warm", "2", "--env", "A=1", "--", "sh", "-c", "echo agent $A")
			if r := run(t, h, "", "session", "ls", "--json"); strings.TrimSpace(r.stdout) != "[]" {
				t.Errorf("session ls shows the warm boundaries: %s", r.stdout)
			}
			warm := waitWarm(t, h, 2)

			out, id := execWarm(t, h, "w", "--", "sh", "-c", `echo "own $A $0 $(pwd)"`, "x")
			if want := "own 1 x " + filepath.Join(agentDir(t, h, "w"), "workspace"); strings.TrimSpace(out) != want {
				t.Errorf("a claimed boundary ran %q, want %q", strings.TrimSpace(out), want)
			}
			if _, was := warm[id]; !was || !strings.Contains(shimLog(h, id), "warm boundary claimed") {
				t.Errorf("session %s is not one of the warm boundaries %v; shim log:\n%s", id, warm, shimLog(h, id))
			}
			refilled := waitWarm(t, h, 2)
			if _, again := refilled[id]; again {
				t.Errorf("the claimed boundary %s is warm again", id)
			}

			// An edit: the boundaries built from the old agent go.
			ok(t, h, "agent", "edit", "w", "--env", "A=2")
			eventually(t, 10*time.Second, "the warm boundaries of the old agent gone", func() bool {
				for _, pid := range refilled {
					if procstat.Alive(pid, 0) {
						return false
					}
				}
				return true
			})
			fresh := waitWarm(t, h, 2)
			out, id = execWarm(t, h, "w")
			if _, was := fresh[id]; strings.TrimSpace(out) != "agent 2" || !was {
				t.Errorf("after the edit: %q from session %s (warm: %v), want \"agent 2\" from a warm boundary", out, id, fresh)
			}

			// A supervisor SIGKILL: the next one discards what it finds
			// and builds its own.
			gone := func(left, again map[string]int) {
				t.Helper()
				for old, pid := range left {
					if _, still := again[old]; still || procstat.Alive(pid, 0) {
						t.Errorf("warm boundary %s (shim %d) of the killed supervisor is still there", old, pid)
					}
					for _, dir := range []string{"sessions", "vms"} {
						if _, err := os.Stat(filepath.Join(h, dir, old)); err == nil {
							t.Errorf("warm boundary %s of the killed supervisor left its %s directory", old, dir)
						}
					}
				}
			}
			left := waitWarm(t, h, 2)
			d.kill9()
			d.restart()
			ready := waitWarm(t, h, 2)
			gone(left, ready)
			// Again while the boundaries of an edit are being built (a
			// VM's restore takes a second or more): the shims still
			// preparing go too.
			ok(t, h, "agent", "edit", "w", "--env", "A=3")
			var building map[string]int
			eventually(t, 30*time.Second, "a build of the edited agent begun", func() bool {
				building = warmShims(h)
				for id := range building {
					if _, old := ready[id]; !old {
						return true
					}
				}
				return false
			})
			d.kill9()
			restart := time.Now()
			d.restart()
			t.Logf("SIGKILLed while %d warm boundaries were there or being built; the next daemon answered after %v",
				len(building), time.Since(restart).Round(time.Millisecond))
			gone(building, waitWarm(t, h, 2))
			roots := leftovers.CgroupRoots(show(t, h, id).Cgroup)

			// Removing the agent leaves nothing of its warm boundaries.
			for _, s := range sessionIDs(t, h) {
				ok(t, h, "session", "rm", s)
			}
			ok(t, h, "agent", "rm", "w")
			if w := warmShims(h); len(w) > 0 {
				t.Errorf("warm boundaries after agent rm: %v", w)
			}
			for _, dir := range []string{"sessions", "vms"} {
				if entries, _ := os.ReadDir(filepath.Join(h, dir)); len(entries) > 0 {
					t.Errorf("%s directories after agent rm: %d", dir, len(entries))
				}
			}
			if p := procs.Since(leftovers.Processes(d.pid(), h)); len(p) > 0 {
				t.Errorf("processes of ours after agent rm: %v", p)
			}
			var cgroups []string
			for _, root := range roots {
				entries, _ := os.ReadDir(root)
				for _, e := range entries {
					if e.IsDir() {
						cgroups = append(cgroups, filepath.Join(root, e.Name()))
					}
				}
			}
			if len(cgroups) > 0 {
				t.Errorf("session cgroups after agent rm: %v", cgroups)
			}
			if m := leftovers.MountsUnder(h); len(m) > 0 {
				t.Errorf("mounts under the home after agent rm: %v", m)
			}
		})
	}
}

// TestWarmSrtBindsLate: what is a session's own reaches a warm srt sandbox
// at claim time: a secret's placeholder and the session CA in the trust
// store; a repository made in the workspace after the sandbox was built
// is protected all the same (the stale sandbox is built again); and a
// daemon that stops leaves no warm sandbox behind.
func TestWarmSrtBindsLate(t *testing.T) {
	requireRoot(t)
	requireBwrap(t)
	h := newHome(t)
	d := startDaemon(t, h)
	run(t, h, secretValue, "secret", "set", "claude", "--preset", "anthropic")
	ok(t, h, "agent", "create", "w", "--strategy", "srt", "--warm", "1", "--secret", "ANTHROPIC_API_KEY=claude", "--",
		"sh", "-c", `printf '%s %s\n' "$ANTHROPIC_API_KEY" "$(grep -c 'BEGIN CERTIFICATE' "$SSL_CERT_FILE")"`)
	waitWarm(t, h, 1)
	system, _ := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	out, id := execWarm(t, h, "w")
	f := strings.Fields(out)
	if len(f) != 2 || !strings.HasPrefix(f[0], "agentconnect-placeholder-") || f[1] != strconv.Itoa(strings.Count(string(system), "BEGIN CERTIFICATE")+1) {
		t.Errorf("a warm srt session printed %q, want its placeholder and the system's certificates and its CA's (%d)", out, strings.Count(string(system), "BEGIN CERTIFICATE")+1)
	}
	if !strings.Contains(shimLog(h, id), "warm boundary claimed") {
		t.Errorf("session %s did not claim a warm boundary:\n%s", id, shimLog(h, id))
	}
	checkNoValue(t, h)

	// A repository made after the warm sandbox was built.
	waitWarm(t, h, 1)
	ws := filepath.Join(agentDir(t, h, "w"), "workspace")
	if out, err := exec.Command("git", "init", "-q", filepath.Join(ws, "late")).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v: %s", err, out)
	}
	before := sessionIDs(t, h)
	r := run(t, h, "", "exec", "--keep", "w", "--", "sh", "-c", "echo x > late/.git/hooks/pre-commit && echo planted")
	if strings.Contains(r.stdout, "planted") {
		t.Errorf("a warm sandbox built before late/.git let the session plant a hook: %+v", r)
	}
	for _, s := range sessionIDs(t, h) {
		if !slices.Contains(before, s) && !strings.Contains(shimLog(h, s), "warm boundary stale") {
			t.Errorf("session %s did not build its stale warm sandbox again; shim log:\n%s", s, shimLog(h, s))
		}
	}

	// A daemon that stops discards its warm sandboxes.
	warm := waitWarm(t, h, 1)
	d.cmd.Process.Signal(os.Interrupt)
	d.cmd.Wait()
	for id, pid := range warm {
		if procstat.Alive(pid, 0) {
			t.Errorf("warm boundary %s (shim %d) outlived the daemon", id, pid)
		}
		if _, err := os.Stat(filepath.Join(h, "sessions", id)); err == nil {
			t.Errorf("warm boundary %s left its directory after the daemon stopped", id)
		}
	}
	if m := leftovers.MountsUnder(h); len(m) > 0 {
		t.Errorf("mounts under the home after the daemon stopped: %v", m)
	}
	d.restart()
}

// TestWarmVMStale: a repository made in the workspace after a warm VM was
// set up is protected in the session that claims it all the same: the
// stale VM is discarded and a new one booted, as a cold start would.
func TestWarmVMStale(t *testing.T) {
	requireMicrosandbox(t)
	h, _ := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "w", "--strategy", "microsandbox", "--warm", "1", "--",
		"sh", "-c", "echo x > late/.git/hooks/pre-commit && echo planted")
	waitWarm(t, h, 1)
	ws := filepath.Join(agentDir(t, h, "w"), "workspace")
	if out, err := exec.Command("git", "init", "-q", filepath.Join(ws, "late")).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v: %s", err, out)
	}
	before := sessionIDs(t, h)
	r := run(t, h, "", "exec", "--keep", "w")
	if strings.Contains(r.stdout, "planted") {
		t.Errorf("a warm VM set up before late/.git let the session plant a hook: %+v", r)
	}
	for _, s := range sessionIDs(t, h) {
		if !slices.Contains(before, s) && !strings.Contains(shimLog(h, s), "warm boundary stale") {
			t.Errorf("session %s did not build its stale warm VM again; shim log:\n%s", s, shimLog(h, s))
		}
	}
}

// TestWarmVMBuildCancelledByEdit: an agent edited to no warm boundaries
// while one is being built (a VM boots for seconds under TCG) has none once
// its edit is answered: the build is cancelled, its shim killed, and its
// VM, directories and cgroup gone, rather than booting on to be discarded.
func TestWarmVMBuildCancelledByEdit(t *testing.T) {
	requireMicrosandbox(t)
	h, _ := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "w", "--strategy", "microsandbox", "--warm", "1", "--", "true")
	// The build is in flight: its shim serves (bootstrap.json) and the VM
	// boots, and the agent has no warm boundary ready yet.
	var building *apisession.Record
	eventually(t, time.Minute, "a warm VM being built", func() bool {
		layout := home.Layout{Root: h}
		entries, _ := os.ReadDir(layout.SessionsDir())
		for _, e := range entries {
			dir := apisession.Dir(layout.SessionDir(e.Name()))
			if rec, err := dir.ReadRecord(); err == nil && rec.Warm {
				if boot, _ := dir.ReadBootstrap(); boot != nil && procstat.Alive(boot.PID, boot.StartTime) {
					building = rec
					return true
				}
			}
		}
		return false
	})
	var a struct {
		WarmReady int `json:"warmReady"`
	}
	okJSON(t, h, &a, "agent", "show", "w")
	if a.WarmReady != 0 {
		t.Skip("the warm VM was ready before the edit: this machine booted it too fast to catch the build in flight")
	}
	ok(t, h, "agent", "edit", "w", "--warm", "0")
	if w := warmShims(h); len(w) > 0 {
		t.Errorf("warm shims alive once agent edit --warm 0 answered: %v", w)
	}
	for _, under := range []string{"sessions", "vms"} {
		if left := vmProcesses(filepath.Join(h, under) + "/"); len(left) > 0 {
			t.Errorf("processes of the home's %s left once agent edit --warm 0 answered: %v", under, left)
		}
	}
	layout := home.Layout{Root: h}
	for _, dir := range []string{layout.SessionsDir(), layout.VMsDir()} {
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("%s holds %d entries once the build was cancelled", dir, len(entries))
		}
	}
	left := building.Spec.Cgroup
	if building.Spec.VM != nil {
		left = append(left, building.Spec.VM.RunDir)
	}
	for _, p := range left {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("the cancelled build's %s is left (%v)", p, err)
		}
	}
}
