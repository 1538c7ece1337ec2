package probe

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/strategy"
)

func TestRun(t *testing.T) {
	cfg := config.Default()
	env := Env{ImageDir: t.TempDir()}
	res := Run(cfg, env)
	if len(res) != 3 || res[0].Name != strategy.Host || !res[0].Available {
		t.Fatalf("Run = %+v; want host first and available", res)
	}
	// srt is available exactly where bwrap starts a sandbox here, as the
	// test finds by running one itself.
	bwrapWorks := exec.Command("bwrap", SRTCommand...).Run() == nil
	if res[1].Available != bwrapWorks || (bwrapWorks != (res[1].Reason == "")) {
		t.Errorf("srt: available %v, reason %q; bwrap %v here starts a sandbox: %v", res[1].Available, res[1].Reason, SRTCommand, bwrapWorks)
	}
	// microsandbox: no image in an empty directory, whatever else holds.
	if ms := res[2]; ms.Available || ms.Reason == "" {
		t.Errorf("microsandbox: available %v, reason %q; want unavailable with a reason", ms.Available, ms.Reason)
	}
	if Default(res) != strategy.Host {
		t.Errorf("Default = %q, want host", Default(res))
	}
	// The microsandbox check runs in the shim; without one it says so.
	tcg := config.Default()
	tcg.VM.Accelerator, tcg.VM.Transport = "tcg", "serial"
	if r := checkMicrosandbox(tcg, env); !strings.Contains(r, "agentconnect-shim-vm") {
		t.Errorf("microsandbox with no shim: reason %q, want one naming the shim", r)
	}
	// Through the built shim, without KVM and vsock (as on CI), tcg over
	// serial gets as far as the image: the reason names the directory it is
	// missing from.
	noImager := Env{ImageDir: env.ImageDir, VMShimBinary: "/nonexistent/agentconnect-shim-vm"}
	if r := checkMicrosandbox(tcg, noImager); !strings.Contains(r, "agentconnect-vmimage") {
		t.Errorf("microsandbox with no image helper: reason %q, want one naming agentconnect-vmimage", r)
	}
	if bin := os.Getenv("AGENTCONNECT_BIN"); bin != "" {
		withShim := Env{ImageDir: env.ImageDir, VMShimBinary: filepath.Join(bin, "agentconnect-shim-vm"), VMImageBinary: filepath.Join(bin, "agentconnect-vmimage")}
		if r := checkMicrosandbox(tcg, withShim); !strings.Contains(r, env.ImageDir) && !strings.Contains(r, "qemu") && !strings.Contains(r, "virtiofsd") {
			t.Errorf("microsandbox with tcg and no image: reason %q names neither the image directory nor a missing tool", r)
		}
	} else {
		t.Log("AGENTCONNECT_BIN is not set (make test sets it): the check through the shim is not run")
	}

	// Without bwrap on PATH, srt is unavailable and says how to install it.
	t.Setenv("PATH", t.TempDir())
	if r := Run(cfg, env)[1]; r.Available || r.Reason != ReasonBwrapMissing {
		t.Errorf("srt without bwrap: available %v, reason %q; want %q", r.Available, r.Reason, ReasonBwrapMissing)
	}

	cfg.RequireSandbox("--require-sandbox turns host off on this daemon")
	cfg.Offered[strategy.SRT] = false
	cfg.OffReason[strategy.SRT] = "sandbox.srt is off on this daemon"
	res = Run(cfg, env)
	if AnyAvailable(res) {
		t.Errorf("with everything off, a strategy is available: %+v", res)
	}
	if res[1].Reason != "sandbox.srt is off on this daemon" {
		t.Errorf("srt reason = %q, want the config's", res[1].Reason)
	}
	if Default(res) != "" {
		t.Errorf("Default = %q with nothing available", Default(res))
	}
}
