package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/helper"
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

// agentconnect-vmimage is asked once for the default image, and again only
// when the image, the helper or the request changed; an error is never
// kept. Runs the built helper (make test sets AGENTCONNECT_BIN), through a
// script that counts its runs.
func TestImageAnswers(t *testing.T) {
	bin := os.Getenv("AGENTCONNECT_BIN")
	if bin == "" {
		t.Skip("AGENTCONNECT_BIN is not set (make test sets it): needs the built agentconnect-vmimage")
	}
	dir := t.TempDir()
	imageDir := filepath.Join(dir, "image")
	os.Mkdir(imageDir, 0o755)
	count := filepath.Join(dir, "runs")
	wrapper := filepath.Join(dir, "agentconnect-vmimage")
	script := "#!/bin/sh\necho >> " + count + "\nexec " + filepath.Join(bin, "agentconnect-vmimage") + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	runs := func() int {
		b, _ := os.ReadFile(count)
		return len(b)
	}
	manifest := func(digit string) {
		t.Helper()
		m := `{"rootfsDigest": "sha256:` + strings.Repeat(digit, 64) + `"}`
		if err := os.WriteFile(filepath.Join(imageDir, "image.json.new"), []byte(m), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Rename(filepath.Join(imageDir, "image.json.new"), filepath.Join(imageDir, "image.json"))
	}
	var c imageAnswers
	req := helper.ImageRequest{ImageDir: imageDir, ImagesDir: filepath.Join(dir, "images")}
	ask := func(what string, r helper.ImageRequest, wantDigit string, wantRuns int) {
		t.Helper()
		resp, err := c.answer(context.Background(), wrapper, r, t.Logf)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		switch {
		case wantDigit == "" && resp.Error == "":
			t.Errorf("%s: answer %+v, want an error", what, resp)
		case wantDigit != "" && resp.Digest != "sha256:"+strings.Repeat(wantDigit, 64):
			t.Errorf("%s: answer %+v, want digest %s...", what, resp, wantDigit)
		}
		if got := runs(); got != wantRuns {
			t.Errorf("%s: the helper ran %d times in all, want %d", what, got, wantRuns)
		}
	}
	ask("no image", req, "", 1)
	manifest("a")
	for _, f := range []string{"vmlinuz", "initrd.img", "rootfs.img"} {
		os.WriteFile(filepath.Join(imageDir, f), []byte("x"), 0o644)
	}
	ask("an error is not kept", req, "a", 2)
	ask("the same image", req, "a", 2)
	ask("again", req, "a", 2)
	manifest("b")
	ask("image.json replaced", req, "b", 3)
	ask("the new one kept", req, "b", 3)
	os.WriteFile(filepath.Join(imageDir, "rootfs.img"), []byte("xy"), 0o644)
	ask("rootfs.img rewritten", req, "b", 4)
	os.WriteFile(wrapper, []byte(script+"\n"), 0o755)
	ask("the helper replaced", req, "b", 5)
	other := req
	other.ImagesDir = filepath.Join(dir, "other")
	ask("another request", other, "b", 6)
	ask("the first request again", req, "b", 7)
	os.Remove(filepath.Join(imageDir, "vmlinuz"))
	ask("vmlinuz removed", req, "", 8)
	ask("still removed", req, "", 9)
}
