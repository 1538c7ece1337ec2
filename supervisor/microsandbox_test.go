package supervisor

import (
	"testing"

	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// A runtime tree is left out of a VM's shares only when the image holds
// that runtime at the pinned version.
func TestImageHas(t *testing.T) {
	codex := runtimes.Known["codex"]
	pinned := codex.Package + "@" + codex.Version
	cases := []struct {
		name    string
		inImage map[string]string
		target  string
		want    bool
	}{
		{"pinned", map[string]string{"codex": pinned}, runtimes.Target("codex"), true},
		{"another version", map[string]string{"codex": codex.Package + "@0.0.1"}, runtimes.Target("codex"), false},
		{"a custom image", nil, runtimes.Target("codex"), false},
		{"another runtime's tree", map[string]string{"codex": pinned}, runtimes.Target("claude"), false},
		{"not a runtime tree", map[string]string{"codex": pinned}, "/etc/codex/requirements.toml", false},
		{"an unknown name", map[string]string{"nope": "x@1"}, runtimes.MountRoot + "/nope", false},
	}
	for _, c := range cases {
		if got := imageHas(c.inImage, c.target); got != c.want {
			t.Errorf("%s: imageHas = %v, want %v", c.name, got, c.want)
		}
	}
}
