// Package vmimage names the guest images the microsandbox strategy boots: the
// default image that `make image` builds (kernel, initramfs with the vmagent,
// a Debian root) and the references of custom ones (a registry reference, an
// OCI image layout or an image archive), checked without touching the
// network. Preparing a custom image is package custom's, which pulls over
// the network (go-containerregistry's remote package, hence net/http and
// crypto/tls): it runs in agentconnect-vmimage, so that neither the daemon
// nor a VM's shim carries that code.
package vmimage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// DefaultRef names the default image in a configuration and in Image.Ref.
const DefaultRef = "default"

// Image is a guest image ready to boot: kernel and initramfs of this release,
// and a root filesystem.
type Image struct {
	Kernel, Initrd, Rootfs string
	// Digest identifies the root: for the default image the sha256 of
	// rootfs.img, for a custom image the content digest of its manifest
	// ("sha256:...").
	Digest string
	// Ref is DefaultRef or the reference as configured.
	Ref string
	// Runtimes are the known ACP runtimes the root holds at
	// /opt/agentconnect/runtimes/NAME, as "package@version" by name (the
	// default image's; a custom image has none).
	Runtimes map[string]string
}

// defaultManifest is the default image's image.json (scripts/build-image.sh).
type defaultManifest struct {
	KernelVersion string   `json:"kernelVersion"`
	RootfsDigest  string   `json:"rootfsDigest"`
	BuiltAt       string   `json:"builtAt"`
	Packages      []string `json:"packages"`
	// Runtimes: name to "package@version", installed in the root.
	Runtimes map[string]string `json:"runtimes"`
}

var sha256Digest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

const buildHint = "build it with `make image` (as root), or install it with `make install`"

// DefaultFiles are the files Default reads in dir: image.json, vmlinuz,
// initrd.img and rootfs.img, in that order.
func DefaultFiles(dir string) []string {
	return []string{filepath.Join(dir, "image.json"), filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.img"), filepath.Join(dir, "rootfs.img")}
}

// Default reads the default image from dir (image.json, vmlinuz, initrd.img,
// rootfs.img). A missing or incomplete image is an error that says how to
// build or install it.
func Default(dir string) (*Image, error) {
	files := DefaultFiles(dir)
	manifestPath := files[0]
	b, err := os.ReadFile(manifestPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errdefs.FailedPrecondition("no default guest image in %s (%s is missing, so it was never built or its build did not finish): %s", dir, manifestPath, buildHint)
	}
	if err != nil {
		return nil, fmt.Errorf("default guest image: %w", err)
	}
	var m defaultManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, errdefs.FailedPrecondition("default guest image: %s is not valid JSON (%v): %s", manifestPath, err, buildHint)
	}
	if !sha256Digest.MatchString(m.RootfsDigest) {
		return nil, errdefs.FailedPrecondition("default guest image: %s has no rootfsDigest \"sha256:<64 hex>\" (got %q): %s", manifestPath, m.RootfsDigest, buildHint)
	}
	img := &Image{
		Kernel:   files[1],
		Initrd:   files[2],
		Rootfs:   files[3],
		Digest:   m.RootfsDigest,
		Ref:      DefaultRef,
		Runtimes: m.Runtimes,
	}
	for _, p := range []string{img.Kernel, img.Initrd, img.Rootfs} {
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
			return nil, errdefs.FailedPrecondition("default guest image in %s is incomplete (%s is missing or empty): %s", dir, filepath.Base(p), buildHint)
		}
	}
	return img, nil
}

const refHelp = `use a registry reference ("debian:bookworm", "registry.example.com/team/image:tag", "...@sha256:<64 hex>"), "oci:PATH" or "oci:PATH@sha256:<64 hex>" (an OCI image layout directory), or "archive:PATH" (a docker-save or OCI image tarball)`

// CheckRef says whether a custom image reference is well-formed, touching
// nothing but a stat of a local path: a registry reference, "oci:PATH" (an
// OCI image layout directory, optionally "oci:PATH@sha256:..."), or
// "archive:PATH" (a docker-save or OCI tarball). DefaultRef is well-formed.
func CheckRef(ref string) error {
	_, err := ParseRef(ref)
	return err
}

// RefKind is what a reference names.
type RefKind int

const (
	KindDefault  RefKind = iota // DefaultRef
	KindRegistry                // a registry reference
	KindLayout                  // "oci:PATH", an OCI image layout directory
	KindArchive                 // "archive:PATH", a docker-save or OCI tarball
)

// Ref is a parsed image reference.
type Ref struct {
	Kind   RefKind
	Path   string         // KindLayout, KindArchive
	Digest *v1.Hash       // KindLayout with @sha256:..., KindRegistry by digest
	Named  name.Reference // KindRegistry
}

// ParseRef parses ref as CheckRef checks it.
func ParseRef(ref string) (Ref, error) {
	switch {
	case ref == "":
		return Ref{}, errdefs.InvalidArgument("empty image reference: %s", refHelp)
	case ref == DefaultRef:
		return Ref{Kind: KindDefault}, nil
	case strings.HasPrefix(ref, "oci:"):
		p := Ref{Kind: KindLayout, Path: strings.TrimPrefix(ref, "oci:")}
		if i := strings.LastIndex(p.Path, "@"); i >= 0 && strings.HasPrefix(p.Path[i+1:], "sha256:") {
			h, err := v1.NewHash(p.Path[i+1:])
			if err != nil || !sha256Digest.MatchString(h.String()) {
				return Ref{}, errdefs.InvalidArgument("image %q: %q is not a digest: write oci:PATH@sha256:<64 lowercase hex>", ref, p.Path[i+1:])
			}
			p.Path, p.Digest = p.Path[:i], &h
		}
		if p.Path == "" {
			return Ref{}, errdefs.InvalidArgument("image %q names no directory: write oci:PATH, PATH being an OCI image layout directory (holding oci-layout and index.json)", ref)
		}
		fi, err := os.Stat(p.Path)
		if err != nil {
			return Ref{}, errdefs.InvalidArgument("image %q: %v (oci:PATH names an OCI image layout directory)", ref, err)
		}
		if !fi.IsDir() {
			return Ref{}, errdefs.InvalidArgument("image %q: %s is not a directory (oci:PATH names an OCI image layout directory; for a tarball use archive:PATH)", ref, p.Path)
		}
		return p, nil
	case strings.HasPrefix(ref, "archive:"):
		p := Ref{Kind: KindArchive, Path: strings.TrimPrefix(ref, "archive:")}
		if p.Path == "" {
			return Ref{}, errdefs.InvalidArgument("image %q names no file: write archive:PATH, PATH being a docker-save or OCI image tarball", ref)
		}
		fi, err := os.Stat(p.Path)
		if err != nil {
			return Ref{}, errdefs.InvalidArgument("image %q: %v (archive:PATH names a docker-save or OCI image tarball)", ref, err)
		}
		if !fi.Mode().IsRegular() {
			return Ref{}, errdefs.InvalidArgument("image %q: %s is not a regular file (archive:PATH names a docker-save or OCI image tarball; for a layout directory use oci:PATH)", ref, p.Path)
		}
		return p, nil
	}
	if strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "../") || strings.HasPrefix(ref, "~") {
		return Ref{}, errdefs.InvalidArgument("image %q is a path, not a registry reference: %s", ref, refHelp)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		why := err.Error()
		if strings.ToLower(ref) != ref {
			why += "; repository names are lowercase"
		}
		return Ref{}, errdefs.InvalidArgument("image %q is not a valid reference (%s): %s", ref, why, refHelp)
	}
	p := Ref{Kind: KindRegistry, Named: r}
	if d, ok := r.(name.Digest); ok {
		h, err := v1.NewHash(d.DigestStr())
		if err != nil {
			return Ref{}, errdefs.InvalidArgument("image %q: %v: %s", ref, err, refHelp)
		}
		p.Digest = &h
	}
	return p, nil
}
