package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/probe"
)

// newTestSupervisor makes a supervisor on a fresh home, with config.json
// holding cfg when it is not empty. Nothing is started.
func newTestSupervisor(t *testing.T, cfg string, setup func(home string)) *Supervisor {
	t.Helper()
	dir := t.TempDir()
	l := home.Layout{Root: dir}
	if err := l.Create(); err != nil {
		t.Fatal(err)
	}
	if cfg != "" {
		os.WriteFile(l.ConfigPath(), []byte(cfg), 0o600)
	}
	if setup != nil {
		setup(dir)
	}
	lock, err := l.Lock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	log := logrus.New()
	log.SetOutput(testWriter{t})
	s, err := newSupervisor(Options{Home: dir, ShimBinary: "/nonexistent", Lock: lock, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// writeLegacyAgent stores an agent the way releases before strategies did.
func writeLegacyAgent(t *testing.T, dir, id, name string, runInSandbox bool) {
	t.Helper()
	adir := filepath.Join(dir, "agents", id)
	os.MkdirAll(filepath.Join(adir, "workspace"), 0o700)
	legacy := map[string]any{"id": id, "name": name, "command": []string{"true"}, "workspace": "workspace", "runInSandbox": runInSandbox}
	if err := atomicfile.WriteJSON(filepath.Join(adir, agent.File), legacy, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLegacyRunInSandboxMapping(t *testing.T) {
	for _, tc := range []struct {
		name, cfg    string
		runInSandbox bool
		want         strategy.Name
	}{
		{"off is host", "", false, strategy.Host},
		{"on is srt", "", true, strategy.SRT},
		{"on follows the retired backend", `{"sandbox": {"backend": "microsandbox"}}`, true, strategy.Microsandbox},
		{"off ignores the backend", `{"sandbox": {"backend": "microsandbox"}}`, false, strategy.Host},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dir string
			s := newTestSupervisor(t, tc.cfg, func(h string) {
				dir = h
				writeLegacyAgent(t, h, "0123456789abcdef", "old", tc.runInSandbox)
			})
			a, err := s.getAgent("old")
			if err != nil {
				t.Fatal(err)
			}
			if a.Strategy != tc.want {
				t.Errorf("strategy = %q, want %q", a.Strategy, tc.want)
			}
			// Saved, so the mapping happens once.
			var saved agent.Agent
			atomicfile.ReadJSON(filepath.Join(dir, "agents", "0123456789abcdef", agent.File), &saved)
			if saved.Strategy != tc.want || saved.RunInSandbox != nil {
				t.Errorf("saved agent: strategy %q, runInSandbox %v; want %q and no legacy key", saved.Strategy, saved.RunInSandbox, tc.want)
			}
		})
	}
}

func TestNotOfferedAgentIsRefused(t *testing.T) {
	s := newTestSupervisor(t, "", func(h string) {
		writeLegacyAgent(t, h, "0123456789abcdef", "boxed", true) // srt
	})
	s.probes = []probe.Result{{Name: strategy.Host, Available: true}, {Name: strategy.SRT, Reason: "sandbox.srt is off on this daemon"}}
	a, err := s.getAgent("boxed")
	if err != nil {
		t.Fatal(err)
	}
	offered, why := s.offered(a)
	if offered || !strings.HasPrefix(why, "Not offered where this agent is placed.") {
		t.Errorf("offered = %v, %q; want the seed's words", offered, why)
	}
	_, err = s.startSession(context.Background(), "boxed", nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "sandbox.srt is off on this daemon") {
		t.Errorf("startSession = %v, want FailedPrecondition with the reason", err)
	}
	if entries, _ := os.ReadDir(s.layout.SessionsDir()); len(entries) != 0 {
		t.Errorf("a refused session left %d entries in sessions/", len(entries))
	}
}

func TestSandboxOffIsRefusedWithTheConfigsWords(t *testing.T) {
	s := newTestSupervisor(t, `{"sandbox": {"srt": false}}`, nil)
	_, err := s.createAgent(context.Background(), agent.Agent{Name: "x", Strategy: strategy.SRT, Command: []string{"true"}})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "sandbox.srt is off on this daemon") {
		t.Errorf("createAgent(srt) = %v, want FailedPrecondition with the config's words", err)
	}
}

func TestDefaultStrategy(t *testing.T) {
	s := newTestSupervisor(t, "", nil)
	a, err := s.createAgent(context.Background(), agent.Agent{Name: "x", Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Strategy != strategy.Host {
		t.Errorf("default strategy = %q, want host", a.Strategy)
	}
	// With host off, a new agent gets the first available sandbox: simulate
	// srt available, as the probe of a later build reports it.
	s.probes = []probe.Result{{Name: strategy.Host, Reason: "off"}, {Name: strategy.SRT, Available: true}, {Name: strategy.Microsandbox, Available: true}}
	a, err = s.createAgent(context.Background(), agent.Agent{Name: "y", Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if a.Strategy != strategy.SRT {
		t.Errorf("default strategy with host off = %q, want srt", a.Strategy)
	}
}

func TestRuntimeEnv(t *testing.T) {
	t.Setenv("DAEMON_SECRET", "x")
	env := runtimeEnv([]string{"PATH=/opt/bin", "FOO=1"}, "/h", "/t")
	got := strings.Join(env, " ")
	for _, want := range []string{"PATH=/opt/bin", "FOO=1", "HOME=/h", "TMPDIR=/t", "LANG=", "TERM=dumb"} {
		if !strings.Contains(got, want) {
			t.Errorf("env %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "DAEMON_SECRET") {
		t.Error("the daemon's environment leaked into the runtime's")
	}
	if strings.Count(got, "PATH=") != 1 {
		t.Errorf("PATH twice in %q", got)
	}
}
