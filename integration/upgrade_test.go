package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// previousRelease is the last commit before the shim was split into a shim
// per strategy family (issue 8): one agentconnect-shim served every
// strategy. A supervisor of this release must adopt the sessions such a shim
// serves: an upgrade in place keeps them.
const previousRelease = "c9d170e"

// buildRelease builds agentconnect and agentconnect-shim of rev from this
// repository's history into a directory of their own.
func buildRelease(t *testing.T, rev string) string {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed (make deps installs it)")
	}
	root, err := exec.Command(git, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout, so release %s cannot be built: %v", rev, err)
	}
	if err := exec.Command(git, "-C", strings.TrimSpace(string(root)), "cat-file", "-e", rev+"^{commit}").Run(); err != nil {
		t.Skipf("this checkout's history lacks release %s (a shallow clone?)", rev)
	}
	src := t.TempDir()
	archive := exec.Command(git, "-C", strings.TrimSpace(string(root)), "archive", "--format=tar", rev)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v", rev, err)
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar release %s: %v", rev, err)
	}
	out := t.TempDir()
	os.Chmod(out, 0o755)
	build := exec.Command("go", "build", "-o", out, "./cmd/agentconnect", "./cmd/agentconnect-shim")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build release %s: %v\n%s", rev, err, b)
	}
	return out
}

// TestUpgradeAdoptsThePreviousReleasesShims: sessions started by the
// previous release (its daemon and its one shim, host and srt) go on under
// this release's supervisor, which adopts the old shims through the shim
// API's handshake: the same pids, their output complete, and a stop that
// ends them as it would its own.
func TestUpgradeAdoptsThePreviousReleasesShims(t *testing.T) {
	requireBwrap(t)
	old := buildRelease(t, previousRelease)
	h := newHome(t)
	d := &daemon{t: t, home: h, bin: filepath.Join(old, "agentconnect")}
	d.start()
	t.Cleanup(d.cleanup)
	ids := map[string]string{}
	for _, strategy := range []string{"host", "srt"} {
		ok(t, h, "agent", "create", "counter-"+strategy, "--strategy", strategy, "--", "sh", "-c", counter)
		ids[strategy] = strings.TrimSpace(ok(t, h, "session", "start", "counter-"+strategy))
	}
	before := map[string]session{}
	for s, id := range ids {
		eventually(t, 10*time.Second, s+"'s first ticks", func() bool {
			return strings.Count(ok(t, h, "session", "logs", id), "\n") >= 3
		})
		before[s] = show(t, h, id)
	}

	// The upgrade: the old daemon goes, this release's starts on the home.
	d.kill9()
	d.bin = ""
	d.restart()
	for s, id := range ids {
		after := show(t, h, id)
		if after.State != "running" || after.PID != before[s].PID || after.ShimPID != before[s].ShimPID {
			t.Fatalf("%s session after the upgrade: %+v; before: %+v", s, after, before[s])
		}
		n := strings.Count(ok(t, h, "session", "logs", id), "\n")
		eventually(t, 10*time.Second, s+"'s ticks after the upgrade", func() bool {
			return strings.Count(ok(t, h, "session", "logs", id), "\n") > n+3
		})
	}
	for s, id := range ids {
		ok(t, h, "session", "stop", id)
		st := show(t, h, id)
		if st.State != "exited" || st.ExitCode != 143 {
			t.Errorf("%s session stopped after the upgrade: %+v, want exited with 143", s, st)
		}
		checkCounter(t, s, ok(t, h, "session", "logs", id))
	}
}
