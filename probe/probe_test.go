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
	for _, r := range res[1:] {
		if r.Available || !strings.Contains(r.Reason, "cannot run") {
			t.Errorf("%s: available %v, reason %q; want unavailable, saying this build cannot run it", r.Name, r.Available, r.Reason)
		}
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
