// Package sandbox builds the srt boundary: the bubblewrap command line that
// puts a session's runtime in its own user, pid, net, ipc, uts, cgroup and
// mount namespaces, with no capabilities, a read-only system, the agent's
// directories writable, the daemon's state hidden, and the files that host
// tools would trust (git hooks and config, shell rc files, editor and MCP
// settings) read-only. The runtime's network is loopback only: listeners the
// shim serves as the policy proxy.
package sandbox

import (
	"fmt"
	"os"
	"strings"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/protect"
)

// The files a launched sandbox inherits, by fd number. Fds 3 and 4 belong
// to the shim's launcher (agentconnect-shim init).
const (
	FDStatus    = 5  // bwrap --json-status-fd: the sandbox's pid, then its exit
	FDStderr    = 6  // the runtime's stderr; fd 2 is bwrap's own, for setup errors
	FDListeners = 7  // a socket on which sandbox-exec hands the proxy listeners to the shim
	FDExecError = 8  // sandbox-exec writes "CODE message" here when it cannot exec the runtime
	FDSeccomp   = 9  // the seccomp program, read by bwrap
	FDChecks    = 10 // what sandbox-exec checks of the protected binds (protect.Verify)
	FDExec      = 11 // the runtime's command and environment (execmsg), once the session binds the sandbox
	firstBindFD = 12 // then one fd per directory bound from an fd
)

// Proxy ports inside the sandbox, as sandbox-runtime has them.
const (
	HTTPProxyPort  = session.SRTHTTPProxyPort
	SOCKSProxyPort = session.SRTSOCKSProxyPort
)

// ProxyEnv points every usual proxy variable at the sandbox's proxy, which
// is its only network.
func ProxyEnv() []string {
	httpProxy := fmt.Sprintf("http://127.0.0.1:%d", HTTPProxyPort)
	socks := fmt.Sprintf("socks5h://127.0.0.1:%d", SOCKSProxyPort)
	noProxy := "localhost,127.0.0.1,::1"
	var env []string
	for _, kv := range [][2]string{{"HTTP_PROXY", httpProxy}, {"HTTPS_PROXY", httpProxy}, {"ALL_PROXY", socks}, {"NO_PROXY", noProxy}} {
		env = append(env, kv[0]+"="+kv[1], strings.ToLower(kv[0])+"="+kv[1])
	}
	return env
}

// ShimPath is where the shim binary is bound inside the sandbox, to run
// sandbox-exec.
const ShimPath = "/run/agentconnect/agentconnect-shim"

// Mount is a host path shared into the sandbox.
type Mount struct {
	Source   string
	Target   string
	ReadOnly bool
}

// Config is what a session's boundary is built from.
type Config struct {
	// DaemonHome is hidden entirely; the agent's directories inside it are
	// bound back at their own paths.
	DaemonHome string
	// SocketCache keeps, across starts, where walks found the host's
	// sockets that their names do not lead to (see view.hostSockets);
	// "" for none.
	SocketCache string
	// Hidden are more directories to hide: the daemon user's home, other
	// users' homes. The system's /home, /root, /tmp, /var/tmp and /run are
	// always replaced by empty ones.
	Hidden []string
	// AgentDir is the agent's directory; Home, Memory and Tmp are inside it,
	// and so is Workspace unless SharedWorkspace.
	AgentDir        string
	Workspace       string
	SharedWorkspace bool
	Home            string
	Memory          string
	Tmp             string
	Mounts          []Mount
	// Credentials are host paths of the daemon user's credential files:
	// absent inside wherever a mount or the shared workspace holds them.
	Credentials []string
	// NestedSandbox lets the runtime start its own sandbox inside (new user
	// namespaces and mounts); Landlock is not applied then, as it forbids
	// mounts.
	NestedSandbox bool
	// Ledger is the daemon's record of running boundaries and their
	// placeholders (see package protect).
	Ledger string
	// CABundle, if set, is bound read-only at session.CABundlePath.
	CABundle *os.File
}

// Boundary is a built sandbox: bwrap's arguments (after "bwrap"), the files
// it needs at fds firstBindFD and up, and the checks sandbox-exec reads at
// FDChecks.
type Boundary struct {
	Args   []string
	Files  []*os.File
	Checks *os.File
	// Premount, when Build was asked to leave the protected names to it,
	// binds them in the mount namespace bwrap is started in (see
	// protect.Premount); nil when bwrap binds them.
	Premount func() error
	plan     *protect.Plan
}

// Close releases the fds. The caller closes them once bwrap has started (it
// holds its own copies).
func (b *Boundary) Close() {
	for _, f := range b.Files {
		f.Close()
	}
	b.Checks.Close()
	b.plan.CloseBinds()
}

// Audit reports, once the sandbox is gone, the git hooks and config the run
// wrote in repositories it created (see protect.Plan.Audit).
func (b *Boundary) Audit() []protect.Finding { return b.plan.Audit() }

// Stale reports whether the workspace and mounts now hold a repository the
// boundary does not protect (see protect.Plan.Stale).
func (b *Boundary) Stale() (bool, error) { return b.plan.Stale() }

// Watch follows the workspace and mounts until Stale (see
// protect.Plan.Watch).
func (b *Boundary) Watch() error { return b.plan.Watch() }

// Release ends the sandbox's run, once it is gone: the placeholders made for
// absent protected names are removed when no other boundary of the daemon
// runs (one that started since may have bound them read-only).
func (b *Boundary) Release() {
	b.plan.Release()
}
