// Package probe checks, for each execution strategy a daemon offers, whether
// sessions can run in it here, and says why not. A check installs and
// downloads nothing.
package probe

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/helper"
	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/hostuser"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// Result is one strategy's check.
type Result struct {
	Name      strategy.Name `json:"name"`
	Available bool          `json:"available"`
	Reason    string        `json:"reason"`
	// Detail says how the strategy runs here when it runs: for
	// microsandbox, the accelerator and the transport.
	Detail string `json:"detail"`
}

// Env is what the checks need to know about this installation beyond the
// config.
type Env struct {
	// ImageDir holds the default microVM image (kernel, initrd, root
	// filesystem).
	ImageDir string
	// VMShimBinary is the shim that runs microsandbox sessions
	// (agentconnect-shim-vm): it runs microsandbox's check, whose code
	// the daemon does not link.
	VMShimBinary string
	// VMImageBinary prepares microsandbox's guest images
	// (agentconnect-vmimage).
	VMImageBinary string
	// Home is the daemon's home, which sandbox.host.user must reach.
	Home string
}

// checks are the live checks per strategy.
var checks = map[strategy.Name]func(*config.Config, Env) string{
	strategy.Host:         checkHost,
	strategy.SRT:          checkSRTStrategy,
	strategy.Microsandbox: checkMicrosandbox,
}

// Run checks every strategy, all at once (microsandbox's starts QEMU, which
// takes a while), and returns the results in the order of strategy.All. A
// strategy the config turns off is not checked: its reason is the config's.
func Run(cfg *config.Config, env Env) []Result {
	results := make([]Result, len(strategy.All))
	var wg sync.WaitGroup
	for i, n := range strategy.All {
		results[i].Name = n
		if !cfg.Offered[n] {
			results[i].Reason = cfg.OffReason[n]
			continue
		}
		wg.Add(1)
		go func(r *Result) {
			defer wg.Done()
			r.Reason = checks[n](cfg, env)
			r.Available = r.Reason == ""
			switch {
			case n == strategy.Microsandbox:
				r.Detail = fmt.Sprintf("%s accelerator, %s transport", cfg.VM.Accelerator, cfg.VM.Transport)
			case n == strategy.Host && cfg.Host.User != "":
				r.Detail = "runtimes run as " + cfg.Host.User
			}
		}(&results[i])
	}
	wg.Wait()
	return results
}

// AnyAvailable reports whether at least one strategy is available.
func AnyAvailable(results []Result) bool {
	for _, r := range results {
		if r.Available {
			return true
		}
	}
	return false
}

// Default is the strategy a new agent gets: host where it can run, else the
// first available sandbox; "" when none is available.
func Default(results []Result) strategy.Name {
	for _, r := range results {
		if r.Available {
			return r.Name
		}
	}
	return ""
}

func checkHost(cfg *config.Config, env Env) string {
	if runtime.GOOS != "linux" {
		return "host sessions need Linux"
	}
	if cfg.Host.User != "" {
		return hostuser.Check(cfg.Host.User, os.Geteuid(), env.Home)
	}
	return ""
}

// checkSRTStrategy: bwrap starts a sandbox here, and Landlock (without
// which no srt session runs) is there.
func checkSRTStrategy(*config.Config, Env) string {
	if r := landlockReason(landlockABI()); r != "" {
		return r
	}
	return CheckSRT("")
}

// landlockABI is the kernel's Landlock ABI version (0: none), asked with
// landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION).
func landlockABI() int {
	const createRulesetVersion = 1
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, createRulesetVersion)
	if errno != 0 {
		return 0
	}
	return int(abi)
}

// landlockReason says why srt cannot run without Landlock, or "".
func landlockReason(abi int) string {
	if abi >= 1 {
		return ""
	}
	return "the kernel does not offer Landlock, which srt applies beside its read-only mounts (writes only beneath the agent's directories): " +
		"use Linux 5.13 or later built with CONFIG_SECURITY_LANDLOCK, with landlock in the lsm= boot parameter"
}

// microsandboxCheckTimeout bounds the shim's microsandbox check: its QEMU
// checks are bounded at 15 s each.
const microsandboxCheckTimeout = time.Minute

// checkMicrosandbox runs the microsandbox check in the shim that runs its
// sessions (see strategy/microsandbox.Check).
func checkMicrosandbox(cfg *config.Config, env Env) string {
	if env.VMShimBinary == "" {
		return "agentconnect-shim-vm, which runs microsandbox sessions, is not installed beside agentconnect (make install)"
	}
	if env.VMImageBinary == "" {
		return "agentconnect-vmimage, which prepares microsandbox's guest images, is not installed beside agentconnect (make install)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), microsandboxCheckTimeout)
	defer cancel()
	var resp helper.ProbeResponse
	if err := helper.Call(ctx, env.VMShimBinary, "probe", helper.ProbeRequest{VM: cfg.VM, ImageDir: env.ImageDir}, &resp, func(string, ...any) {}); err != nil {
		return "the microsandbox check did not run: " + err.Error()
	}
	return resp.Reason
}
