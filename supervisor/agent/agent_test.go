package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// fixture makes a daemon home with an agent directory and a host directory
// outside it.
func fixture(t *testing.T) (daemonHome, agentDir, outside string) {
	t.Helper()
	root := t.TempDir()
	daemonHome = filepath.Join(root, "home")
	agentDir = filepath.Join(daemonHome, "agents", "a1")
	outside = filepath.Join(root, "outside")
	for _, d := range []string{agentDir, outside} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return
}

func TestValidate(t *testing.T) {
	daemonHome, agentDir, outside := fixture(t)
	os.Symlink(outside, filepath.Join(agentDir, "escape"))
	os.MkdirAll(filepath.Join(agentDir, "workspace", "proj"), 0o700)
	os.Symlink(filepath.Join(agentDir, "workspace", "proj"), filepath.Join(agentDir, "inner"))
	sessions := filepath.Join(daemonHome, "sessions")
	os.MkdirAll(sessions, 0o700)

	base := func() Agent { return Agent{Name: "claude", Command: []string{"claude-agent-acp"}} }
	for _, tc := range []struct {
		name    string
		mod     func(a *Agent)
		wantErr string
		check   func(t *testing.T, a Agent)
	}{
		{name: "minimal", mod: func(a *Agent) {}, check: func(t *testing.T, a Agent) {
			if a.Workspace != DefaultWorkspace {
				t.Errorf("workspace = %q, want the default", a.Workspace)
			}
		}},
		{name: "name with slash", mod: func(a *Agent) { a.Name = "a/b" }, wantErr: `agent name "a/b"`},
		{name: "empty name", mod: func(a *Agent) { a.Name = "" }, wantErr: "agent name"},
		{name: "dot name", mod: func(a *Agent) { a.Name = ".." }, wantErr: "agent name"},
		{name: "unknown strategy", mod: func(a *Agent) { a.Strategy = "docker" }, wantErr: "unknown execution strategy"},
		{name: "empty command", mod: func(a *Agent) { a.Command = nil }, wantErr: "empty command"},
		{name: "blank command", mod: func(a *Agent) { a.Command = []string{""} }, wantErr: "empty command"},
		{name: "known runtime", mod: func(a *Agent) { a.Command, a.Runtime, a.RuntimeArgs = nil, "codex", []string{"-c", "model=x"} }},
		{name: "unknown runtime", mod: func(a *Agent) { a.Command, a.Runtime = nil, "nope" }, wantErr: `no such runtime (known: claude, codex, gemini, opencode)`},
		{name: "runtime and command", mod: func(a *Agent) { a.Runtime = "claude" }, wantErr: "both a command and --runtime claude"},
		{name: "runtime args alone", mod: func(a *Agent) { a.RuntimeArgs = []string{"-x"} }, wantErr: "runtimeArgs without a runtime"},
		{name: "runtime arg NUL", mod: func(a *Agent) { a.Command, a.Runtime, a.RuntimeArgs = nil, "claude", []string{"a\x00b"} }, wantErr: "NUL"},
		{name: "env without value", mod: func(a *Agent) { a.Env = []string{"FOO"} }, wantErr: "want KEY=VALUE"},
		{name: "env bad key", mod: func(a *Agent) { a.Env = []string{"1X=2"} }, wantErr: "not a variable name"},
		{name: "env HOME reserved", mod: func(a *Agent) { a.Env = []string{"HOME=/root"} }, wantErr: "the daemon sets HOME"},
		{name: "workspace dotdot", mod: func(a *Agent) { a.Workspace = "../a2/workspace" }, wantErr: "inside the agent directory"},
		{name: "workspace deep dotdot", mod: func(a *Agent) { a.Workspace = "workspace/../../x" }, wantErr: "inside the agent directory"},
		{name: "workspace symlink escape", mod: func(a *Agent) { a.Workspace = "escape/proj" }, wantErr: "outside"},
		{name: "workspace agent dir itself", mod: func(a *Agent) { a.Workspace = "." }, wantErr: "inside the agent directory"},
		{name: "workspace agent.json", mod: func(a *Agent) { a.Workspace = "agent.json" }, wantErr: "inside the agent directory"},
		{name: "workspace absolute outside", mod: func(a *Agent) { a.Workspace = outside }, wantErr: "outside the agent directory"},
		{name: "workspace absolute inside", mod: func(a *Agent) { a.Workspace = filepath.Join(agentDir, "workspace", "proj") }, check: func(t *testing.T, a Agent) {
			if a.Workspace != "workspace/proj" {
				t.Errorf("workspace = %q, want workspace/proj", a.Workspace)
			}
		}},
		{name: "workspace symlink inside", mod: func(a *Agent) { a.Workspace = "inner" }},
		{name: "shared workspace", mod: func(a *Agent) { a.SharedWorkspace = outside }, check: func(t *testing.T, a Agent) {
			if a.SharedWorkspace != outside || a.Workspace != "" {
				t.Errorf("shared = %q workspace = %q", a.SharedWorkspace, a.Workspace)
			}
		}},
		{name: "shared workspace in daemon home", mod: func(a *Agent) { a.SharedWorkspace = sessions }, wantErr: "inside the daemon home"},
		{name: "shared workspace missing", mod: func(a *Agent) { a.SharedWorkspace = outside + "/nope" }, wantErr: "no such file"},
		{name: "shared workspace relative", mod: func(a *Agent) { a.SharedWorkspace = "rel" }, wantErr: "absolute"},
		{name: "mount inside daemon home", mod: func(a *Agent) { a.Mounts = []Mount{{Source: sessions, Target: "/data"}} }, wantErr: "inside the daemon home"},
		{name: "mount containing daemon home", mod: func(a *Agent) { a.Mounts = []Mount{{Source: filepath.Dir(daemonHome), Target: "/data"}} }, wantErr: "contains the daemon home"},
		{name: "mount over proc", mod: func(a *Agent) { a.Mounts = []Mount{{Source: outside, Target: "/proc"}} }, wantErr: "may not cover /proc"},
		{name: "mount under sys", mod: func(a *Agent) { a.Mounts = []Mount{{Source: outside, Target: "/sys/fs"}} }, wantErr: "may not cover /sys"},
		{name: "mount over root", mod: func(a *Agent) { a.Mounts = []Mount{{Source: outside, Target: "/"}} }, wantErr: "may not cover /"},
		{name: "mount missing source", mod: func(a *Agent) { a.Mounts = []Mount{{Source: "/no/such/dir", Target: "/x"}} }, wantErr: "no such file"},
		{name: "mount relative target", mod: func(a *Agent) { a.Mounts = []Mount{{Source: outside, Target: "x"}} }, wantErr: "absolute"},
		{name: "mount ok", mod: func(a *Agent) { a.Mounts = []Mount{{Source: outside, Target: "/opt/tools/", ReadOnly: true}} }, check: func(t *testing.T, a Agent) {
			if a.Mounts[0].Target != "/opt/tools" {
				t.Errorf("target = %q, want it cleaned", a.Mounts[0].Target)
			}
		}},
		{name: "bad domain", mod: func(a *Agent) { a.AllowedDomains = []string{"exa mple.com"} }, wantErr: "domain"},
		{name: "login", mod: func(a *Agent) {
			a.Login = &Login{Runtime: "claude", File: ".claude/.credentials.json", Template: `{"a":"{{c-claude-access}}"}`}
		}},
		{name: "login file outside the home", mod: func(a *Agent) {
			a.Login = &Login{Runtime: "claude", File: "../.bashrc", Template: `{{x}}`}
		}, wantErr: "inside the agent's home"},
		{name: "login file absolute", mod: func(a *Agent) { a.Login = &Login{Runtime: "claude", File: "/etc/passwd", Template: `{{x}}`} }, wantErr: "inside the agent's home"},
		{name: "login without a token", mod: func(a *Agent) { a.Login = &Login{Runtime: "claude", File: "c.json", Template: `{}`} }, wantErr: "no {{SECRET}}"},
		{name: "bad port", mod: func(a *Agent) { a.AllowedDomains = []string{"example.com:0"} }, wantErr: "port"},
		{name: "domains cleaned", mod: func(a *Agent) {
			a.AllowedDomains = []string{"API.Example.com", "*.npmjs.org", "127.0.0.1:8080", "[::1]:443"}
		}, check: func(t *testing.T, a Agent) {
			if a.AllowedDomains[0] != "api.example.com" {
				t.Errorf("domain = %q, want lower case", a.AllowedDomains[0])
			}
		}},
		{name: "pids too low", mod: func(a *Agent) { a.Resources.Pids = 2 }, wantErr: "pids 2"},
		{name: "memory too low", mod: func(a *Agent) { a.Resources.MemoryMiB = 1 }, wantErr: "memoryMiB 1"},
		{name: "warm srt", mod: func(a *Agent) { a.Strategy, a.Warm = "srt", MaxWarm }},
		{name: "warm too many", mod: func(a *Agent) { a.Warm = MaxWarm + 1 }, wantErr: "warm 17: want 0 to 16"},
		{name: "warm negative", mod: func(a *Agent) { a.Warm = -1 }, wantErr: "warm -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base()
			tc.mod(&a)
			err := Validate(&a, daemonHome, agentDir)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate = %v, want an error containing %q", err, tc.wantErr)
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Errorf("error kind of %v is not InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tc.check != nil {
				tc.check(t, a)
			}
		})
	}
}

func TestParseMount(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Mount
		wantErr bool
	}{
		{in: "/src:/dst", want: Mount{"/src", "/dst", true}},
		{in: "/src:/dst:ro", want: Mount{"/src", "/dst", true}},
		{in: "/src:/dst:rw", want: Mount{"/src", "/dst", false}},
		{in: "type=bind,src=/s,dst=/d", want: Mount{"/s", "/d", true}},
		{in: "type=bind,source=/s,target=/d,readonly", want: Mount{"/s", "/d", true}},
		{in: "type=bind,src=/s,dst=/d,readonly=false", want: Mount{"/s", "/d", false}},
		{in: "type=bind,src=/s,dst=/d,rw", want: Mount{"/s", "/d", false}},
		{in: "/src:/dst:rx", wantErr: true},
		{in: "/src", wantErr: true},
		{in: ":/dst", wantErr: true},
		{in: "type=volume,src=/s,dst=/d", wantErr: true},
		{in: "type=bind,src=/s", wantErr: true},
		{in: "type=bind,src=/s,dst=/d,bogus=1", wantErr: true},
	} {
		got, err := ParseMount(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("ParseMount(%q) = %+v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseMount(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestStore(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	a := &Agent{ID: NewID(), Name: "x", Command: []string{"true"}, Workspace: "workspace/proj"}
	if err := s.Create(a); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"workspace/proj", HomeDir, MemoryDir, TmpDir, File} {
		if _, err := os.Stat(filepath.Join(s.AgentDir(a.ID), d)); err != nil {
			t.Errorf("agent dir lacks %s: %v", d, err)
		}
	}
	// A broken agent.json is reported, not fatal.
	os.MkdirAll(filepath.Join(s.Dir, "broken"), 0o700)
	os.WriteFile(filepath.Join(s.Dir, "broken", File), []byte("{"), 0o600)
	agents, problems, err := s.Load()
	if err != nil || len(agents) != 1 || agents[0].Name != "x" || len(problems) != 1 {
		t.Fatalf("Load = %d agents, problems %v, %v", len(agents), problems, err)
	}
	if err := s.Remove(a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.AgentDir(a.ID)); !os.IsNotExist(err) {
		t.Errorf("agent dir still there after Remove: %v", err)
	}
}
