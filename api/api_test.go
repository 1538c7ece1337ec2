// Package api holds the wire APIs; this test keeps the committed Go code in
// step with the .proto files.
package api

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var generated = []string{
	"admin/v1/admin.pb.go", "admin/v1/admin_ttrpc.pb.go",
	"shim/v1/internal/shimpb/shim.pb.go", "shim/v1/internal/shimpb/shim_ttrpc.pb.go",
	"vmagent/v1/vmagent.pb.go", "vmagent/v1/vmagent_ttrpc.pb.go",
}

// TestGeneratedCodeIsCurrent regenerates the code and compares it with the
// committed files: a .proto changed without `make proto` fails here.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-ttrpc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH (make deps installs it; make test puts it on PATH)", tool)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("./generate.sh", out)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("generate.sh: %v", err)
	}
	for _, f := range generated {
		want, err := os.ReadFile(filepath.Join(out, "api", f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("api/%s is stale: run `make proto` and commit the result", f)
		}
	}
}
