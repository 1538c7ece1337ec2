package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// SRTCommand is the sandbox CheckSRT starts: bwrap with its own network
// namespace, the smallest sandbox that fails where srt's would. It is the
// command the troubleshooting docs tell users to run by hand.
var SRTCommand = []string{"--unshare-net", "--ro-bind", "/", "/", "true"}

// SRTTimeout bounds the bwrap run of CheckSRT.
const SRTTimeout = 5 * time.Second

// Reason texts of the srt check that do not depend on what bwrap printed.
const (
	ReasonBwrapMissing = "bwrap is not installed: apt-get install bubblewrap (srt needs bwrap only; not socat or ripgrep)"

	// apparmorFix is how to give bwrap its AppArmor profile.
	apparmorFix = "Fix: load the AppArmor profile for bwrap from the agentconnect repository's contrib/apparmor/bwrap: " +
		"sudo cp contrib/apparmor/bwrap /etc/apparmor.d/bwrap && sudo apparmor_parser -r /etc/apparmor.d/bwrap; " +
		"then restart the daemon so it checks its strategies again."
)

// Sysctls are the kernel settings ClassifySRT reads. Unknown is a setting
// whose /proc/sys file is absent or unreadable.
type Sysctls struct {
	// AppArmorRestrictUserns is /proc/sys/kernel/apparmor_restrict_unprivileged_userns
	// (Ubuntu 23.10 and later).
	AppArmorRestrictUserns int
	// MaxUserNamespaces is /proc/sys/user/max_user_namespaces.
	MaxUserNamespaces int
	// UnprivilegedUsernsClone is /proc/sys/kernel/unprivileged_userns_clone
	// (Debian and Ubuntu kernels).
	UnprivilegedUsernsClone int
}

// Unknown is the value of a Sysctls field that could not be read.
const Unknown = -1

// ReadSysctls reads the settings ClassifySRT uses from /proc/sys.
func ReadSysctls() Sysctls {
	return Sysctls{
		AppArmorRestrictUserns:  readSysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
		MaxUserNamespaces:       readSysctl("/proc/sys/user/max_user_namespaces"),
		UnprivilegedUsernsClone: readSysctl("/proc/sys/kernel/unprivileged_userns_clone"),
	}
}

func readSysctl(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return Unknown
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return Unknown
	}
	return n
}

// CheckSRT reports whether srt sessions can start here: "" when they can,
// else the reason, which names the cause and the fix. It installs and
// downloads nothing. It looks bwrap up in PATH (bwrap is the name or path to
// look up; "" means "bwrap") and runs SRTCommand with it, bounded by
// SRTTimeout; a failure is classified by ClassifySRT from bwrap's stderr and
// the kernel's user-namespace settings.
func CheckSRT(bwrap string) string {
	if bwrap == "" {
		bwrap = "bwrap"
	}
	path, err := exec.LookPath(bwrap)
	if err != nil {
		return ReasonBwrapMissing
	}
	ctx, cancel := context.WithTimeout(context.Background(), SRTTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, SRTCommand...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if err == nil {
		return ""
	}
	if ctx.Err() != nil {
		return fmt.Sprintf("bwrap cannot start a sandbox here: `bwrap %s` did not finish within %s", strings.Join(SRTCommand, " "), SRTTimeout)
	}
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) {
		return "bwrap cannot start a sandbox here: " + err.Error()
	}
	sysctls := ReadSysctls()
	if strings.TrimSpace(stderr.String()) == "" && sysctls.MaxUserNamespaces != 0 && sysctls.UnprivilegedUsernsClone != 0 {
		return fmt.Sprintf("bwrap cannot start a sandbox here: `bwrap %s` failed (%v) and printed nothing", strings.Join(SRTCommand, " "), err)
	}
	return ClassifySRT(stderr.String(), sysctls)
}

// apparmorSigns are what bwrap prints when AppArmor's restriction leaves
// its user namespace without capabilities.
var apparmorSigns = []string{
	"Failed RTM_NEWADDR",
	"setting up uid map: Permission denied",
}

// usernsSigns are what bwrap prints when it cannot create a user namespace.
var usernsSigns = []string{
	"No permissions to create new namespace",
	"No permissions to creating new namespace", // bwrap before 0.5
	"Creating new namespace failed",
	"user namespace",
	"max_user_namespaces",
	"unprivileged_userns_clone",
}

// maxStderr bounds how much of bwrap's stderr a reason quotes.
const maxStderr = 500

// ClassifySRT turns a failed bwrap run's stderr and the kernel's settings
// into the reason srt is unavailable. It is a pure function.
//
//   - AppArmor's restriction on unprivileged user namespaces ("Failed
//     RTM_NEWADDR", "setting up uid map: Permission denied"): names
//     kernel.apparmor_restrict_unprivileged_userns and the profile in
//     contrib/apparmor/bwrap, and quotes bwrap's line.
//   - No user namespaces (bwrap cannot create one, or
//     user.max_user_namespaces or kernel.unprivileged_userns_clone is 0):
//     "user namespaces are off", with the sysctl that turns them on.
//   - Anything else: "bwrap cannot start a sandbox here: " and the stderr.
func ClassifySRT(stderr string, s Sysctls) string {
	if line, ok := findLine(stderr, apparmorSigns); ok {
		var cause string
		if s.AppArmorRestrictUserns == 1 {
			cause = "AppArmor restricts unprivileged user namespaces on this host (kernel.apparmor_restrict_unprivileged_userns=1), " +
				"so bwrap gets no capabilities in its user namespace and cannot set up the sandbox"
		} else {
			cause = "bwrap gets no capabilities in its user namespace, the way it fails when AppArmor restricts unprivileged user namespaces " +
				"(kernel.apparmor_restrict_unprivileged_userns=1, the default on Ubuntu 24.04 and later)"
		}
		return fmt.Sprintf("%s; bwrap printed %q. %s", cause, line, apparmorFix)
	}

	line, signed := findLine(stderr, usernsSigns)
	cloneOff := s.UnprivilegedUsernsClone == 0
	maxOff := s.MaxUserNamespaces == 0
	if !signed && !cloneOff && !maxOff {
		return "bwrap cannot start a sandbox here: " + clip(strings.TrimSpace(stderr))
	}

	var b strings.Builder
	b.WriteString("user namespaces are off")
	switch {
	case cloneOff && maxOff:
		b.WriteString(" (kernel.unprivileged_userns_clone=0 and user.max_user_namespaces=0)")
	case cloneOff:
		b.WriteString(" (kernel.unprivileged_userns_clone=0)")
	case maxOff:
		b.WriteString(" (user.max_user_namespaces=0)")
	}
	b.WriteString(", and bwrap needs them to start a sandbox")
	if signed {
		fmt.Fprintf(&b, "; bwrap printed %q", line)
	} else if s := strings.TrimSpace(stderr); s != "" {
		fmt.Fprintf(&b, "; bwrap printed %q", clip(s))
	}
	b.WriteString(". Turn them on: ")
	switch {
	case cloneOff && maxOff:
		b.WriteString("printf 'kernel.unprivileged_userns_clone = 1\\nuser.max_user_namespaces = 15000\\n' | sudo tee /etc/sysctl.d/60-userns.conf && sudo sysctl --system")
	case cloneOff:
		b.WriteString("echo 'kernel.unprivileged_userns_clone = 1' | sudo tee /etc/sysctl.d/60-userns.conf && sudo sysctl --system")
	case maxOff:
		b.WriteString("echo 'user.max_user_namespaces = 15000' | sudo tee /etc/sysctl.d/60-userns.conf && sudo sysctl --system")
	default:
		b.WriteString("set user.max_user_namespaces above 0 and, on Debian and Ubuntu kernels, kernel.unprivileged_userns_clone = 1 " +
			"(for example in /etc/sysctl.d/60-userns.conf, then sudo sysctl --system); " +
			"inside a container or another sandbox, that sandbox must allow them (Docker's default seccomp profile does not)")
	}
	b.WriteString("; then restart the daemon.")
	if s.AppArmorRestrictUserns == 1 && !cloneOff && !maxOff {
		b.WriteString(" kernel.apparmor_restrict_unprivileged_userns=1 here too: if an AppArmor profile denies bwrap user namespaces " +
			"(such as Ubuntu's bwrap-userns-restrict), load contrib/apparmor/bwrap instead: " +
			"sudo cp contrib/apparmor/bwrap /etc/apparmor.d/bwrap && sudo apparmor_parser -r /etc/apparmor.d/bwrap.")
	}
	return b.String()
}

// findLine returns the first line of text that contains one of signs,
// ignoring case, trimmed.
func findLine(text string, signs []string) (string, bool) {
	for _, line := range strings.Split(text, "\n") {
		lower := strings.ToLower(line)
		for _, sign := range signs {
			if strings.Contains(lower, strings.ToLower(sign)) {
				return clip(strings.TrimSpace(line)), true
			}
		}
	}
	return "", false
}

func clip(s string) string { return errdefs.Clip(s, maxStderr) }
