package config

import (
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/strategy"
)

// FuzzParse: any document parses to a configuration or an error that names
// what is wrong, never a panic; a configuration it accepts offers each
// strategy or says why not, has VM settings in their ranges, and parses
// the same again.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		``, `{}`, `{"sandbox": {}}`, `{"sandbox": {"host": false}}`,
		`{"sandbox": {"host": {"user": "agentconnect"}, "srt": {"resolver": "127.0.0.1:53"}}}`,
		`{"sandbox": {"microsandbox": {"cpus": 2, "memoryMiB": 2048, "diskGiB": 10, "accelerator": "tcg", "transport": "serial", "image": "oci:/x"}}}`,
		`{"sandbox": {"backend": "srt"}, "security": {"requireSandbox": true}}`,
		`{"socketGroup": "agentconnect", "logLevel": "debug", "outputLimitMiB": 8}`,
		`{"sandbox": {"microsandbox": {"cpus": 1e400}}}`, `{"sandbox": [1]}`, `[]`, `null`, `{"a":`, `{} {}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		for _, n := range strategy.All {
			if !c.Offered[n] && c.OffReason[n] == "" {
				t.Fatalf("%s is not offered and no reason says why", n)
			}
		}
		if c.Offered[strategy.Microsandbox] {
			vm := c.VM
			if vm.CPUs < 1 || vm.MemoryMiB < 128 || vm.DiskGiB < 1 || (vm.Accelerator != "kvm" && vm.Accelerator != "tcg") || (vm.Transport != "vsock" && vm.Transport != "serial") {
				t.Fatalf("VM settings out of range: %+v", vm)
			}
		}
		if strings.ContainsAny(c.Host.User, ":\n") {
			t.Fatalf("host user %q", c.Host.User)
		}
		again, err := Parse(data)
		if err != nil || again.VM != c.VM || again.Host != c.Host || again.LogLevel != c.LogLevel {
			t.Fatalf("a second parse differs: %+v, %v", again, err)
		}
	})
}
