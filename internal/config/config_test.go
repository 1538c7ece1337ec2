package config

import (
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/strategy"
)

func TestParseRules(t *testing.T) {
	for _, tc := range []struct {
		name     string
		json     string
		host     bool
		srt      bool
		ms       bool
		reasons  map[strategy.Name]string
		vm       VM
		backend  strategy.Name
		hostUser string
		output   int      // OutputLimitMiB; 0 for the default
		warns    []string // substrings, one per warning, in order
		wantErr  string   // substring
	}{
		{name: "empty file is the default", json: "", host: true, srt: true, ms: true, vm: DefaultVM},
		{name: "empty object", json: "{}", host: true, srt: true, ms: true, vm: DefaultVM},
		{name: "all on by default", json: `{"sandbox": {}}`, host: true, srt: true, ms: true, vm: DefaultVM},
		{name: "explicit true", json: `{"sandbox": {"host": true, "srt": true, "microsandbox": true}}`, host: true, srt: true, ms: true, vm: DefaultVM},
		{
			name: "each off has the seed's reason", json: `{"sandbox": {"srt": false, "microsandbox": false}}`,
			host: true, vm: DefaultVM,
			reasons: map[strategy.Name]string{
				strategy.SRT:          "sandbox.srt is off on this daemon",
				strategy.Microsandbox: "sandbox.microsandbox is off on this daemon",
			},
		},
		{
			name: "host false requires a sandbox", json: `{"sandbox": {"host": false}}`, srt: true, ms: true, vm: DefaultVM,
			reasons: map[strategy.Name]string{strategy.Host: "sandbox.host is off on this daemon"},
		},
		{
			name: "microsandbox object offers it with settings",
			json: `{"sandbox": {"microsandbox": {"cpus": 4, "memoryMiB": 4096, "diskGiB": 20, "image": "registry.example.com/x:y", "accelerator": "tcg", "transport": "serial", "tcgCacheMiB": 64, "resolver": "127.0.0.1:5353"}}}`,
			host: true, srt: true, ms: true,
			vm: VM{CPUs: 4, MemoryMiB: 4096, DiskGiB: 20, Image: "registry.example.com/x:y", Accelerator: "tcg", Transport: "serial", TCGCacheMiB: 64, Resolver: "127.0.0.1:5353"},
		},
		{
			name: "partial microsandbox object keeps other defaults", json: `{"sandbox": {"microsandbox": {"memoryMiB": 512}}}`,
			host: true, srt: true, ms: true,
			vm: VM{CPUs: 2, MemoryMiB: 512, DiskGiB: 10, Accelerator: "kvm", Transport: "vsock"},
		},
		{
			name: "retired requireSandbox true turns host off", json: `{"security": {"requireSandbox": true}}`,
			srt: true, ms: true, vm: DefaultVM,
			reasons: map[strategy.Name]string{strategy.Host: "security.requireSandbox turns host off on this daemon"},
			warns:   []string{"security.requireSandbox is retired"},
		},
		{
			name: "retired requireSandbox false warns only", json: `{"security": {"requireSandbox": false}}`,
			host: true, srt: true, ms: true, vm: DefaultVM,
			warns: []string{"security.requireSandbox is retired"},
		},
		{
			name: "retired backend is the legacy target and offers everything", json: `{"sandbox": {"backend": "microsandbox", "srt": true}}`,
			host: true, srt: true, ms: true, vm: DefaultVM, backend: strategy.Microsandbox,
			warns: []string{"sandbox.backend is retired"},
		},
		{
			name: "unknown keys warn", json: `{"apiUrl": "wss://x", "sandbox": {"gvisor": true, "microsandbox": {"gpu": 1}}, "security": {"x": 1}}`,
			host: true, srt: true, ms: true, vm: DefaultVM,
			warns: []string{"unknown key apiUrl", "unknown key sandbox.gvisor", "unknown key sandbox.microsandbox.gpu", "unknown key security.x"},
		},
		{name: "sandbox not an object", json: `{"sandbox": true}`, wantErr: "sandbox: want an object"},
		{name: "host wrong type", json: `{"sandbox": {"host": "yes"}}`, wantErr: `sandbox.host: want true, false or an object of host settings such as {"user": "agentconnect"}, got the string "yes"`},
		{name: "host object offers it", json: `{"sandbox": {"host": {"user": "agentconnect"}}}`, host: true, srt: true, ms: true, vm: DefaultVM, hostUser: "agentconnect"},
		{name: "host user not a name", json: `{"sandbox": {"host": {"user": "a:b"}}}`, wantErr: `sandbox.host.user: want the name of an account such as "agentconnect", got "a:b"`},
		{name: "host user empty", json: `{"sandbox": {"host": {"user": ""}}}`, wantErr: `sandbox.host.user: want the name of an account`},
		{name: "host user wrong type", json: `{"sandbox": {"host": {"user": 1000}}}`, wantErr: `sandbox.host.user: want a string, got 1000`},
		{name: "srt object offers it", json: `{"sandbox": {"srt": {"resolver": "127.0.0.1:5353"}}}`, host: true, srt: true, ms: true, vm: DefaultVM},
		{name: "srt bad resolver", json: `{"sandbox": {"srt": {"resolver": "dns.example"}}}`, wantErr: "sandbox.srt.resolver: want an IP address and port"},
		{name: "tcg cache too small", json: `{"sandbox": {"microsandbox": {"tcgCacheMiB": 8}}}`, wantErr: "sandbox.microsandbox.tcgCacheMiB"},
		{name: "srt wrong type", json: `{"sandbox": {"srt": 1}}`, wantErr: "sandbox.srt: want true, false or an object"},
		{name: "microsandbox wrong type", json: `{"sandbox": {"microsandbox": 1}}`, wantErr: "sandbox.microsandbox: want true, false or an object"},
		{name: "memory not a number", json: `{"sandbox": {"microsandbox": {"memoryMiB": "2G"}}}`, wantErr: "sandbox.microsandbox.memoryMiB: want a whole number"},
		{name: "memory fractional", json: `{"sandbox": {"microsandbox": {"memoryMiB": 1.5}}}`, wantErr: "sandbox.microsandbox.memoryMiB"},
		{name: "cpus zero", json: `{"sandbox": {"microsandbox": {"cpus": 0}}}`, wantErr: "sandbox.microsandbox.cpus: want a whole number from 1"},
		{name: "disk negative", json: `{"sandbox": {"microsandbox": {"diskGiB": -1}}}`, wantErr: "sandbox.microsandbox.diskGiB"},
		{name: "bad accelerator", json: `{"sandbox": {"microsandbox": {"accelerator": "hvf"}}}`, wantErr: `sandbox.microsandbox.accelerator: want "kvm" or "tcg"`},
		{name: "bad transport", json: `{"sandbox": {"microsandbox": {"transport": "tcp"}}}`, wantErr: "sandbox.microsandbox.transport"},
		{name: "microsandbox bad resolver", json: `{"sandbox": {"microsandbox": {"resolver": "127.0.0.1"}}}`, wantErr: "sandbox.microsandbox.resolver: want an IP address and port"},
		{name: "empty image", json: `{"sandbox": {"microsandbox": {"image": ""}}}`, wantErr: "sandbox.microsandbox.image"},
		{name: "bad backend", json: `{"sandbox": {"backend": "docker"}}`, wantErr: "sandbox.backend"},
		{name: "requireSandbox wrong type", json: `{"security": {"requireSandbox": "true"}}`, wantErr: "security.requireSandbox: want true or false"},
		{name: "security not an object", json: `{"security": []}`, wantErr: "security: want an object"},
		{name: "bad log level", json: `{"logLevel": "loud"}`, wantErr: "logLevel"},
		{name: "output limit", json: `{"outputLimitMiB": 8}`, host: true, srt: true, ms: true, vm: DefaultVM, output: 8},
		{name: "output limit zero", json: `{"outputLimitMiB": 0}`, wantErr: "outputLimitMiB: want a whole number from 1 to 1048576, got 0"},
		{name: "output limit too big", json: `{"outputLimitMiB": 1048577}`, wantErr: "outputLimitMiB: want a whole number"},
		{name: "output limit with a unit", json: `{"outputLimitMiB": "1G"}`, wantErr: `outputLimitMiB: want a whole number from 1 to 1048576, got the string "1G"`},
		{name: "syntax error names the line", json: "{\n  \"sandbox\": {,}\n}", wantErr: "line 2"},
		{name: "truncated", json: `{"sandbox": {`, wantErr: "invalid JSON"},
		{name: "not an object", json: `[1]`, wantErr: "want a JSON object"},
		{name: "two values", json: `{} {}`, wantErr: "more than one value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.json))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := [3]bool{c.Offered[strategy.Host], c.Offered[strategy.SRT], c.Offered[strategy.Microsandbox]}
			if want := [3]bool{tc.host, tc.srt, tc.ms}; got != want {
				t.Errorf("offered host/srt/microsandbox = %v, want %v", got, want)
			}
			for n, want := range tc.reasons {
				if c.OffReason[n] != want {
					t.Errorf("reason for %s = %q, want %q", n, c.OffReason[n], want)
				}
			}
			if c.VM != tc.vm {
				t.Errorf("VM = %+v, want %+v", c.VM, tc.vm)
			}
			if want := cmp.Or(tc.output, session.DefaultOutputLimitMiB); c.OutputLimitMiB != want {
				t.Errorf("OutputLimitMiB = %d, want %d", c.OutputLimitMiB, want)
			}
			if c.Host.User != tc.hostUser {
				t.Errorf("Host.User = %q, want %q", c.Host.User, tc.hostUser)
			}
			if c.Backend != tc.backend {
				t.Errorf("Backend = %q, want %q", c.Backend, tc.backend)
			}
			if len(c.Warnings) != len(tc.warns) {
				t.Fatalf("warnings = %q, want %d", c.Warnings, len(tc.warns))
			}
			for i, w := range tc.warns {
				if !strings.Contains(c.Warnings[i], w) {
					t.Errorf("warning %d = %q, want it to contain %q", i, c.Warnings[i], w)
				}
			}
		})
	}
}

func TestRequireSandboxFlag(t *testing.T) {
	c := Default()
	c.RequireSandbox("--require-sandbox turns host off on this daemon")
	if c.Offered[strategy.Host] {
		t.Error("host still offered")
	}
	if !strings.Contains(c.OffReason[strategy.Host], "--require-sandbox") {
		t.Errorf("reason = %q", c.OffReason[strategy.Host])
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	c, err := Load(path, false)
	if err != nil || !c.Offered[strategy.Host] || c.Path != "" {
		t.Fatalf("Load of a missing default file = %+v, %v; want the defaults", c, err)
	}
	if _, err := Load(path, true); err == nil {
		t.Fatal("Load of a missing --config file succeeded")
	}
	os.WriteFile(path, []byte(`{"sandbox": {"host": 3}}`), 0o600)
	_, err = Load(path, false)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "sandbox.host") {
		t.Fatalf("Load error = %v, want it to name the file and the key", err)
	}
	os.WriteFile(path, []byte(`{"sandbox": {"host": false}}`), 0o600)
	c, err = Load(path, false)
	if err != nil || c.Offered[strategy.Host] || c.Path != path {
		t.Fatalf("Load = %+v, %v", c, err)
	}
}

func TestTrustedCAFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "ca.pem")
	os.WriteFile(good, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o644)
	notPEM := filepath.Join(dir, "key.txt")
	os.WriteFile(notPEM, []byte("not a certificate"), 0o644)
	c, err := Parse([]byte(`{"trustedCAFile": "` + good + `"}`))
	if err != nil || !strings.Contains(c.TrustedCAPEM, "BEGIN CERTIFICATE") {
		t.Errorf("a PEM file: %v, %q", err, c.TrustedCAPEM)
	}
	for _, path := range []string{notPEM, filepath.Join(dir, "missing.pem")} {
		if _, err := Parse([]byte(`{"trustedCAFile": "` + path + `"}`)); err == nil || !strings.Contains(err.Error(), "trustedCAFile") {
			t.Errorf("trustedCAFile %s: %v, want an error naming the key", path, err)
		}
	}
}
