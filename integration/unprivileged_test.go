package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// nobody is the unprivileged user tests run a daemon as.
const nobody = 65534

// nobodyHome makes a daemon home owned by the unprivileged user nobody.
func nobodyHome(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "agentconnect-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	os.Chmod(base, 0o711)
	home := filepath.Join(base, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return home
}

// TestUnprivilegedDaemonRunsWithoutLimits runs the daemon as an
// unprivileged user, who cannot create cgroups here: sessions run without
// limits and status says so, and an agent that asked for limits is refused
// rather than run without them.
func TestUnprivilegedDaemonRunsWithoutLimits(t *testing.T) {
	requireRoot(t) // to make the unprivileged user's home
	home := nobodyHome(t)
	d := &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
	d.start()
	t.Cleanup(d.cleanup)

	var st statusOut
	okJSON(t, home, &st, "status")
	if st.Cgroups.Available || !strings.Contains(st.Cgroups.Reason, "cannot create cgroups") {
		t.Fatalf("cgroups as an unprivileged daemon: %+v", st.Cgroups)
	}
	if out := ok(t, home, "status"); !strings.Contains(out, "sessions run unlimited") {
		t.Errorf("status does not say sessions run unlimited:\n%s", out)
	}

	ok(t, home, "agent", "create", "free", "--", "sh", "-c", "id -u")
	r := run(t, home, "", "exec", "--keep", "free")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "65534" {
		t.Fatalf("exec as the unprivileged daemon: %+v", r)
	}
	var sessions []session
	okJSON(t, home, &sessions, "session", "ls")
	if len(sessions) != 1 || !strings.HasPrefix(sessions[0].Limits, "none: ") || sessions[0].Cgroup != "" {
		t.Errorf("session limits: %+v", sessions)
	}

	ok(t, home, "agent", "create", "capped", "--memory-mib", "64", "--", "true")
	r = run(t, home, "", "session", "start", "capped")
	if r.code == 0 || !strings.Contains(r.stderr, "asks for limits") || !strings.Contains(r.stderr, "cannot apply them") {
		t.Errorf("a session of an agent with limits: %+v; want it refused", r)
	}
}
