package probe

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// The two texts the troubleshooting docs (shared/seeds) show users, exactly.
const (
	seedRTMNewAddr = "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted"
	seedUIDMap     = "bwrap: setting up uid map: Permission denied"
)

// Texts bubblewrap prints when it cannot create a user namespace (from
// bubblewrap.c; the first is Debian's bubblewrap 0.8, the second upstream's
// before 0.5, the third what a privileged bwrap prints on EPERM, as in a
// Docker container as root, the fourth ENOSPC, as under --disable-userns).
const (
	debianNoPerms  = "bwrap: No permissions to create new namespace, likely because the kernel does not allow non-privileged user namespaces. See <https://deb.li/bubblewrap> or <file:///usr/share/doc/bubblewrap/README.Debian.gz>."
	upstreamNoPerm = "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces. On e.g. debian this can be enabled with 'sysctl kernel.unprivileged_userns_clone=1'."
	eperm          = "bwrap: Creating new namespace failed: Operation not permitted"
	enospc         = "bwrap: Creating new namespace failed: nesting depth or /proc/sys/user/max_*_namespaces exceeded (ENOSPC)"
)

const apparmorCmd = "sudo cp contrib/apparmor/bwrap /etc/apparmor.d/bwrap && sudo apparmor_parser -r /etc/apparmor.d/bwrap"

var unknownSysctls = Sysctls{AppArmorRestrictUserns: Unknown, MaxUserNamespaces: Unknown, UnprivilegedUsernsClone: Unknown}

// onHost is what an ordinary Linux host reads: user namespaces on, no
// AppArmor restriction setting.
var onHost = Sysctls{AppArmorRestrictUserns: Unknown, MaxUserNamespaces: 63000, UnprivilegedUsernsClone: Unknown}

func TestClassifySRT(t *testing.T) {
	ubuntu := Sysctls{AppArmorRestrictUserns: 1, MaxUserNamespaces: 63000, UnprivilegedUsernsClone: 1}
	cases := []struct {
		name    string
		stderr  string
		sysctls Sysctls
		want    []string // substrings, in order
		not     []string
		exact   string // the whole reason, when set
	}{
		{
			name:    "seed RTM_NEWADDR, Ubuntu 24.04",
			stderr:  seedRTMNewAddr + "\n",
			sysctls: ubuntu,
			exact: "AppArmor restricts unprivileged user namespaces on this host (kernel.apparmor_restrict_unprivileged_userns=1), " +
				"so bwrap gets no capabilities in its user namespace and cannot set up the sandbox; " +
				`bwrap printed "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted". ` +
				"Fix: load the AppArmor profile for bwrap from the agentconnect repository's contrib/apparmor/bwrap: " +
				apparmorCmd + "; then restart the daemon so it checks its strategies again.",
		},
		{
			name:    "seed uid map, restriction setting unreadable",
			stderr:  seedUIDMap + "\n",
			sysctls: unknownSysctls,
			exact: "bwrap gets no capabilities in its user namespace, the way it fails when AppArmor restricts unprivileged user namespaces " +
				"(kernel.apparmor_restrict_unprivileged_userns=1, the default on Ubuntu 24.04 and later); " +
				`bwrap printed "bwrap: setting up uid map: Permission denied". ` +
				"Fix: load the AppArmor profile for bwrap from the agentconnect repository's contrib/apparmor/bwrap: " +
				apparmorCmd + "; then restart the daemon so it checks its strategies again.",
		},
		{
			name:    "AppArmor line among others is the one quoted",
			stderr:  "some warning\n" + seedUIDMap + "\ntrailing\n",
			sysctls: ubuntu,
			want:    []string{"kernel.apparmor_restrict_unprivileged_userns=1", `"` + seedUIDMap + `"`, apparmorCmd, "restart the daemon"},
			not:     []string{"some warning", "trailing", "user namespaces are off"},
		},
		{
			name:    "No permissions, Debian with unprivileged_userns_clone=0",
			stderr:  debianNoPerms + "\n",
			sysctls: Sysctls{AppArmorRestrictUserns: Unknown, MaxUserNamespaces: 63000, UnprivilegedUsernsClone: 0},
			exact: "user namespaces are off (kernel.unprivileged_userns_clone=0), and bwrap needs them to start a sandbox; " +
				"bwrap printed " + fmt.Sprintf("%q", debianNoPerms) + ". Turn them on: " +
				"echo 'kernel.unprivileged_userns_clone = 1' | sudo tee /etc/sysctl.d/60-userns.conf && sudo sysctl --system; then restart the daemon.",
		},
		{
			name:    "No permissions, upstream text, settings unknown",
			stderr:  upstreamNoPerm,
			sysctls: unknownSysctls,
			want:    []string{"user namespaces are off, and bwrap needs them", "user.max_user_namespaces above 0", "kernel.unprivileged_userns_clone = 1", "restart the daemon"},
			not:     []string{"AppArmor"},
		},
		{
			name:    "Operation not permitted creating the namespace (root in Docker)",
			stderr:  eperm + "\n",
			sysctls: onHost,
			exact: "user namespaces are off, and bwrap needs them to start a sandbox; " +
				`bwrap printed "bwrap: Creating new namespace failed: Operation not permitted". Turn them on: ` +
				"set user.max_user_namespaces above 0 and, on Debian and Ubuntu kernels, kernel.unprivileged_userns_clone = 1 " +
				"(for example in /etc/sysctl.d/60-userns.conf, then sudo sysctl --system); " +
				"inside a container or another sandbox, that sandbox must allow them (Docker's default seccomp profile does not); then restart the daemon.",
		},
		{
			name:    "ENOSPC with max_user_namespaces=0",
			stderr:  enospc + "\n",
			sysctls: Sysctls{AppArmorRestrictUserns: Unknown, MaxUserNamespaces: 0, UnprivilegedUsernsClone: Unknown},
			want:    []string{"user namespaces are off (user.max_user_namespaces=0)", `"` + enospc + `"`, "echo 'user.max_user_namespaces = 15000' | sudo tee /etc/sysctl.d/60-userns.conf && sudo sysctl --system", "restart the daemon"},
		},
		{
			name:    "both sysctls off",
			stderr:  debianNoPerms,
			sysctls: Sysctls{AppArmorRestrictUserns: Unknown, MaxUserNamespaces: 0, UnprivilegedUsernsClone: 0},
			want:    []string{"user namespaces are off (kernel.unprivileged_userns_clone=0 and user.max_user_namespaces=0)", `kernel.unprivileged_userns_clone = 1\nuser.max_user_namespaces = 15000`},
		},
		{
			name:    "unknown text, but max_user_namespaces=0",
			stderr:  "bwrap: something new\n",
			sysctls: Sysctls{AppArmorRestrictUserns: Unknown, MaxUserNamespaces: 0, UnprivilegedUsernsClone: Unknown},
			want:    []string{"user namespaces are off (user.max_user_namespaces=0)", `bwrap printed "bwrap: something new"`, "user.max_user_namespaces = 15000"},
		},
		{
			name:    "No permissions under the AppArmor restriction (bwrap-userns-restrict)",
			stderr:  debianNoPerms,
			sysctls: ubuntu,
			want:    []string{"user namespaces are off", "kernel.apparmor_restrict_unprivileged_userns=1 here too", "bwrap-userns-restrict", apparmorCmd},
		},
		{
			name:    "unknown text (proc mount refused in a nested sandbox)",
			stderr:  "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n",
			sysctls: onHost,
			exact:   "bwrap cannot start a sandbox here: bwrap: Can't mount proc on /newroot/proc: Operation not permitted",
		},
		{
			name:    "unknown text, several lines, trimmed",
			stderr:  "\n  bwrap: execvp true: No such file or directory\nsecond line\n\n",
			sysctls: onHost,
			exact:   "bwrap cannot start a sandbox here: bwrap: execvp true: No such file or directory\nsecond line",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ClassifySRT(c.stderr, c.sysctls)
			if c.exact != "" && got != c.exact {
				t.Errorf("reason:\n got %q\nwant %q", got, c.exact)
			}
			rest := got
			for _, w := range c.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Errorf("reason %q lacks %q (or not in order)", got, w)
					break
				}
				rest = rest[i+len(w):]
			}
			for _, n := range c.not {
				if strings.Contains(got, n) {
					t.Errorf("reason %q has %q", got, n)
				}
			}
		})
	}
}

func TestClassifySRTClipsLongStderr(t *testing.T) {
	long := "bwrap: " + strings.Repeat("é", 400)
	got := ClassifySRT(long, onHost)
	if len(got) > len("bwrap cannot start a sandbox here: ")+maxStderr+len("…") {
		t.Errorf("reason is %d bytes; want stderr clipped to %d", len(got), maxStderr)
	}
	if !strings.HasSuffix(got, "…") || !strings.Contains(got, "bwrap: éé") {
		t.Errorf("reason = %q; want the start of stderr, clipped", got)
	}
	if !utf8.ValidString(got) {
		t.Errorf("reason %q splits a rune", got)
	}
}

// The two AppArmor texts are the ones the docs show users.
func TestSeedTexts(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "shared", "seeds")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("no seeds directory beside the repository (%v): the texts are checked against the table only", err)
	}
	var all strings.Builder
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			all.Write(b)
		}
	}
	for _, s := range []string{seedRTMNewAddr, seedUIDMap} {
		if !strings.Contains(all.String(), "\n"+s+"\n") {
			t.Errorf("no seed in %s has the line %q", dir, s)
		}
	}
}

func TestCheckSRTBwrapMissing(t *testing.T) {
	if got := CheckSRT(filepath.Join(t.TempDir(), "bwrap")); got != ReasonBwrapMissing {
		t.Errorf("CheckSRT(missing) = %q, want %q", got, ReasonBwrapMissing)
	}
}

func TestCheckSRTHere(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap is not installed here (apt-get install bubblewrap): the live check is not run")
	}
	if got := CheckSRT(""); got != "" {
		t.Errorf("CheckSRT here = %q; want available (bwrap --unshare-net --ro-bind / / true works on this machine)", got)
	}
}

// The helper process for TestCheckSRTUsernsOff: run inside a sandbox that
// forbids user namespaces, it prints CheckSRT's reason.
func TestSRTHelperProcess(t *testing.T) {
	if os.Getenv("AGENTCONNECT_PROBE_SRT_HELPER") != "1" {
		return
	}
	fmt.Print(CheckSRT(""))
	os.Exit(0)
}

// A real "user namespaces off" failure: the probe's bwrap command run inside
// a bwrap sandbox made with --disable-userns. The sandbox's user is not root
// (--uid 65534): bwrap run as root does not need a user namespace for
// --unshare-net and would pass.
func TestCheckSRTUsernsOff(t *testing.T) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		t.Skip("bwrap is not installed here (apt-get install bubblewrap): the live check is not run")
	}
	outer := []string{"--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534",
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--"}
	if out, err := exec.Command(bwrap, append(outer, "true")...).CombinedOutput(); err != nil {
		t.Skipf("cannot make a sandbox without user namespaces here (bwrap 0.8 or newer has --disable-userns): %v: %s", err, out)
	}

	// bwrap directly: its real stderr through the classifier.
	cmd := exec.Command(bwrap, append(append(outer, bwrap), SRTCommand...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatalf("bwrap %v succeeded inside a sandbox with user namespaces disabled", SRTCommand)
	}
	t.Logf("bwrap's stderr inside --disable-userns: %q", stderr.String())
	reason := ClassifySRT(stderr.String(), ReadSysctls())
	t.Logf("reason: %s", reason)
	if !strings.HasPrefix(reason, "user namespaces are off") || !strings.Contains(reason, strings.TrimSpace(stderr.String())) {
		t.Errorf("reason = %q; want user namespaces are off, quoting bwrap", reason)
	}

	// The whole check, re-executing this test binary inside the sandbox; and,
	// as a control, inside the same sandbox with user namespaces allowed.
	helper := func(outer []string) string {
		t.Helper()
		cmd := exec.Command(bwrap, append(outer, os.Args[0], "-test.run=^TestSRTHelperProcess$")...)
		cmd.Env = append(os.Environ(), "AGENTCONNECT_PROBE_SRT_HELPER=1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper: %v: %s", err, out)
		}
		return string(out)
	}
	got := helper(outer)
	t.Logf("CheckSRT inside --disable-userns: %s", got)
	if !strings.HasPrefix(got, "user namespaces are off") {
		t.Errorf("CheckSRT inside a sandbox without user namespaces = %q; want user namespaces are off", got)
	}
	if got := helper(append([]string{outer[0]}, outer[2:]...)); got != "" {
		t.Errorf("CheckSRT inside the same sandbox with user namespaces allowed = %q; want available", got)
	}
}
