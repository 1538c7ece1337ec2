package integration

import (
	"os"
	"strings"
	"syscall"
	"testing"
)

// pivotChain is the second known chain against read-only binds: keep an
// O_PATH fd on a repository's .git, make a user and mount namespace,
// pivot_root away from the sandbox's view and detach it, then write config
// and a hook through the fd.
const pivotChain = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
repo = sys.argv[1]
fd = os.open(os.path.join(repo, ".git"), os.O_PATH)
uid, gid = os.getuid(), os.getgid()
if libc.unshare(0x10000000 | 0x00020000) != 0:
    print("no-userns", ctypes.get_errno()); sys.exit(0)
open("/proc/self/setgroups", "w").write("deny")
open("/proc/self/uid_map", "w").write("0 %d 1" % uid)
open("/proc/self/gid_map", "w").write("0 %d 1" % gid)
libc.mount(b"none", b"/", None, 16384 | (1 << 18), None)
os.makedirs("/tmp/newroot", exist_ok=True)
if libc.mount(b"tmpfs", b"/tmp/newroot", b"tmpfs", 0, None) != 0:
    print("no-mount", ctypes.get_errno()); sys.exit(0)
os.makedirs("/tmp/newroot/old", exist_ok=True)
if libc.syscall(155, b"/tmp/newroot", b"/tmp/newroot/old") != 0:
    print("no-pivot", ctypes.get_errno()); sys.exit(0)
os.chdir("/")
libc.umount2(b"/old", 2)
try:
    w = os.open("config", os.O_WRONLY | os.O_APPEND, dir_fd=fd)
    os.write(w, b"\n[core]\n\tfsmonitor = touch /tmp/pwned\n")
    os.open("hooks/pre-commit", os.O_WRONLY | os.O_CREAT, 0o755, dir_fd=fd)
    print("WROTE")
except OSError as e:
    print("refused", e.strerror)
`

// TestSRTNestedSandbox: with nestedSandbox, a runtime's own bubblewrap
// sandbox (the form Codex runs) works inside srt, and the two known chains
// still cannot write .git/config or .git/hooks. Each chain is run on an
// unprotected repository in the same sandbox too, where it must succeed,
// so that the test can fail.
func TestSRTNestedSandbox(t *testing.T) {
	requireRoot(t) // to make the unprivileged daemon's home
	requireBwrap(t)
	home := nobodyHome(t)
	d := &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
	d.start()
	t.Cleanup(d.cleanup)
	script := `
codex() { bwrap --unshare-user --unshare-pid --unshare-net --ro-bind / / --proc /proc --dev /dev true && echo "codex-form works" || echo "codex-form BROKEN"; }
mvchain() { cd "$1" && mv .git .git2 2>/dev/null && mkdir -p .git/hooks && echo x > .git/hooks/pre-commit && echo "mv-chain WROTE $2" || echo "mv-chain refused $2"; cd "$OLDPWD"; }
codex
mkdir -p /tmp/loose && git init -q /tmp/loose
mvchain /tmp/loose unprotected
mvchain "$PWD" protected
git init -q /tmp/loose2
echo "pivot-chain unprotected $(python3 -c "$PIVOT" /tmp/loose2)"
echo "pivot-chain protected $(python3 -c "$PIVOT" "$PWD")"
git -c safe.directory='*' status --porcelain >/dev/null && echo "git still works"
`
	ok(t, home, "agent", "create", "nested", "--strategy", "srt", "--nested-sandbox", "--env", "PIVOT="+pivotChain, "--", "sh", "-c", script)
	ws := agentDir(t, home, "nested") + "/workspace"
	runAs(t, nobody, "git", "init", "-q", ws)
	r := run(t, home, "", "exec", "nested")
	out := r.stdout
	for _, want := range []string{
		"codex-form works",
		"mv-chain WROTE unprotected", "mv-chain refused protected",
		"pivot-chain unprotected WROTE", "pivot-chain protected refused",
		"git still works",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\nstderr:\n%s", want, out, r.stderr)
		}
	}
	// And nothing reached the repository on the host.
	if data, err := readFileAs(ws + "/.git/config"); err != nil || strings.Contains(data, "fsmonitor") {
		t.Errorf(".git/config after the chains: %q, %v", data, err)
	}
}

func readFileAs(path string) (string, error) {
	data, err := os.ReadFile(path)
	return string(data), err
}
