package vmimage

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

func TestCheckRef(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "image.tar")
	os.WriteFile(file, []byte("x"), 0o644)
	good := []string{
		DefaultRef, "debian:bookworm", "ubuntu", "ghcr.io/org/image:tag", "127.0.0.1:5000/a/b",
		"debian@sha256:" + strings.Repeat("a", 64),
		"oci:" + tmp, "oci:" + tmp + "@sha256:" + strings.Repeat("b", 64), "archive:" + file,
	}
	for _, ref := range good {
		if err := CheckRef(ref); err != nil {
			t.Errorf("CheckRef(%q): %v", ref, err)
		}
	}
	bad := map[string]string{
		"":                           "empty image reference",
		"UPPER/case":                 "not a valid reference",
		"debian@sha256:abc":          "not a valid reference",
		"oci:":                       "names no directory",
		"oci:" + file:                "not a directory",
		"oci:/nonexistent":           "no such file",
		"oci:" + tmp + "@sha256:XYZ": "is not a digest",
		"archive:":                   "names no file",
		"archive:/nonexistent":       "no such file",
		"archive:" + tmp:             "not a regular file",
		"/some/path.tar":             "is a path",
	}
	for ref, want := range bad {
		err := CheckRef(ref)
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckRef(%q) = %v, want an invalid-argument error saying %q", ref, err, want)
			continue
		}
		if !strings.Contains(err.Error(), "oci:PATH") && !strings.Contains(err.Error(), "archive:PATH") {
			t.Errorf("CheckRef(%q) = %v: does not say what a good reference looks like", ref, err)
		}
		t.Logf("CheckRef(%q): %v", ref, err)
	}
}

func TestDefault(t *testing.T) {
	dir := t.TempDir()
	_, err := Default(dir)
	if err == nil || !strings.Contains(err.Error(), "make image") || !strings.Contains(err.Error(), "make install") {
		t.Fatalf("Default(empty dir) = %v, want an error saying to run make image", err)
	}
	t.Logf("no image: %v", err)
	digest := "sha256:" + strings.Repeat("c", 64)
	os.WriteFile(filepath.Join(dir, "image.json"), []byte(`{"kernelVersion": "6.1.0-57-cloud-amd64", "rootfsDigest": "`+digest+`", "builtAt": "2026-01-01T00:00:00Z", "packages": ["bash=5"], "runtimes": {"codex": "@zed-industries/codex-acp@0.16.0"}}`), 0o644)
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644)
	}
	if _, err := Default(dir); err == nil || !strings.Contains(err.Error(), "rootfs.img") || !strings.Contains(err.Error(), "make image") {
		t.Errorf("Default(no rootfs.img) = %v, want an error naming it", err)
	}
	os.WriteFile(filepath.Join(dir, "rootfs.img"), []byte("x"), 0o644)
	img, err := Default(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := Image{Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img"), Rootfs: filepath.Join(dir, "rootfs.img"), Digest: digest, Ref: DefaultRef,
		Runtimes: map[string]string{"codex": "@zed-industries/codex-acp@0.16.0"}}
	if !reflect.DeepEqual(*img, want) {
		t.Errorf("Default = %+v, want %+v", *img, want)
	}
	os.WriteFile(filepath.Join(dir, "image.json"), []byte(`{"rootfsDigest": "sha256:short"}`), 0o644)
	if _, err := Default(dir); err == nil || !strings.Contains(err.Error(), "rootfsDigest") {
		t.Errorf("Default(bad digest) = %v", err)
	}
}

// TestDefaultBuilt reads the image scripts/build-image.sh made, if there is one.
func TestDefaultBuilt(t *testing.T) {
	dir := os.Getenv("AGENTCONNECT_IMAGE")
	if dir == "" {
		dir = "../../../bin/image"
	}
	if _, err := os.Stat(filepath.Join(dir, "image.json")); err != nil {
		t.Skipf("no default image in %s (make image)", dir)
	}
	img, err := Default(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("default image: %+v", img)
}
