package probe

import (
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/config"
	"github.com/agentconnect-md/agentconnect/strategy"
)

func TestRun(t *testing.T) {
	cfg := config.Default()
	res := Run(cfg)
	if len(res) != 3 || res[0].Name != strategy.Host || !res[0].Available {
		t.Fatalf("Run = %+v; want host first and available", res)
	}
	// srt is what its live check says on this machine.
	if want := checkSRTStrategy(cfg); res[1].Available != (want == "") || res[1].Reason != want {
		t.Errorf("srt: available %v, reason %q; the live check says %q", res[1].Available, res[1].Reason, want)
	}
	if ms := res[2]; ms.Available || !strings.Contains(ms.Reason, "cannot run") {
		t.Errorf("microsandbox: available %v, reason %q; want unavailable, saying this build cannot run it", ms.Available, ms.Reason)
	}
	if Default(res) != strategy.Host {
		t.Errorf("Default = %q, want host", Default(res))
	}

	cfg.RequireSandbox("--require-sandbox turns host off on this daemon")
	cfg.Offered[strategy.SRT] = false
	cfg.OffReason[strategy.SRT] = "sandbox.srt is off on this daemon"
	res = Run(cfg)
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
