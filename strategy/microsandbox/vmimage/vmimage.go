// Package vmimage finds the guest images the microsandbox strategy boots: the
// default image that `make image` builds (kernel, initramfs with the vmagent,
// a Debian root), and custom root filesystems made from container images
// (a registry reference, an OCI image layout or an image archive), prepared
// once per content digest and cached.
//
// It pulls images over the network (go-containerregistry's remote package,
// hence net/http): it belongs in the daemon, not in the shim.
package vmimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

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
}

// defaultManifest is the default image's image.json (scripts/build-image.sh).
type defaultManifest struct {
	KernelVersion string   `json:"kernelVersion"`
	RootfsDigest  string   `json:"rootfsDigest"`
	BuiltAt       string   `json:"builtAt"`
	Packages      []string `json:"packages"`
}

var sha256Digest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

const buildHint = "build it with `make image` (as root), or install it with `make install`"

// Default reads the default image from dir (image.json, vmlinuz, initrd.img,
// rootfs.img). A missing or incomplete image is an error that says how to
// build or install it.
func Default(dir string) (*Image, error) {
	manifestPath := filepath.Join(dir, "image.json")
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
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
		Rootfs: filepath.Join(dir, "rootfs.img"),
		Digest: m.RootfsDigest,
		Ref:    DefaultRef,
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
	_, err := parseRef(ref)
	return err
}

type refKind int

const (
	kindDefault refKind = iota
	kindRegistry
	kindLayout
	kindArchive
)

type parsedRef struct {
	kind   refKind
	path   string         // kindLayout, kindArchive
	digest *v1.Hash       // kindLayout with @sha256:..., kindRegistry by digest
	named  name.Reference // kindRegistry
}

func parseRef(ref string) (parsedRef, error) {
	switch {
	case ref == "":
		return parsedRef{}, errdefs.InvalidArgument("empty image reference: %s", refHelp)
	case ref == DefaultRef:
		return parsedRef{kind: kindDefault}, nil
	case strings.HasPrefix(ref, "oci:"):
		p := parsedRef{kind: kindLayout, path: strings.TrimPrefix(ref, "oci:")}
		if i := strings.LastIndex(p.path, "@"); i >= 0 && strings.HasPrefix(p.path[i+1:], "sha256:") {
			h, err := v1.NewHash(p.path[i+1:])
			if err != nil || !sha256Digest.MatchString(h.String()) {
				return parsedRef{}, errdefs.InvalidArgument("image %q: %q is not a digest: write oci:PATH@sha256:<64 lowercase hex>", ref, p.path[i+1:])
			}
			p.path, p.digest = p.path[:i], &h
		}
		if p.path == "" {
			return parsedRef{}, errdefs.InvalidArgument("image %q names no directory: write oci:PATH, PATH being an OCI image layout directory (holding oci-layout and index.json)", ref)
		}
		fi, err := os.Stat(p.path)
		if err != nil {
			return parsedRef{}, errdefs.InvalidArgument("image %q: %v (oci:PATH names an OCI image layout directory)", ref, err)
		}
		if !fi.IsDir() {
			return parsedRef{}, errdefs.InvalidArgument("image %q: %s is not a directory (oci:PATH names an OCI image layout directory; for a tarball use archive:PATH)", ref, p.path)
		}
		return p, nil
	case strings.HasPrefix(ref, "archive:"):
		p := parsedRef{kind: kindArchive, path: strings.TrimPrefix(ref, "archive:")}
		if p.path == "" {
			return parsedRef{}, errdefs.InvalidArgument("image %q names no file: write archive:PATH, PATH being a docker-save or OCI image tarball", ref)
		}
		fi, err := os.Stat(p.path)
		if err != nil {
			return parsedRef{}, errdefs.InvalidArgument("image %q: %v (archive:PATH names a docker-save or OCI image tarball)", ref, err)
		}
		if !fi.Mode().IsRegular() {
			return parsedRef{}, errdefs.InvalidArgument("image %q: %s is not a regular file (archive:PATH names a docker-save or OCI image tarball; for a layout directory use oci:PATH)", ref, p.path)
		}
		return p, nil
	}
	if strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "./") || strings.HasPrefix(ref, "../") || strings.HasPrefix(ref, "~") {
		return parsedRef{}, errdefs.InvalidArgument("image %q is a path, not a registry reference: %s", ref, refHelp)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		why := err.Error()
		if strings.ToLower(ref) != ref {
			why += "; repository names are lowercase"
		}
		return parsedRef{}, errdefs.InvalidArgument("image %q is not a valid reference (%s): %s", ref, why, refHelp)
	}
	p := parsedRef{kind: kindRegistry, named: r}
	if d, ok := r.(name.Digest); ok {
		h, err := v1.NewHash(d.DigestStr())
		if err != nil {
			return parsedRef{}, errdefs.InvalidArgument("image %q: %v: %s", ref, err, refHelp)
		}
		p.digest = &h
	}
	return p, nil
}

// Store prepares custom images in Dir (the daemon's <home>/images), each
// once, identified by content digest. A Store must not be copied after first
// use.
type Store struct {
	Dir string
	// Base is the default image: custom images boot its kernel and initramfs.
	Base *Image
	// Logf, if set, reports slow work (pulling and building an image).
	Logf func(string, ...any)

	mu sync.Mutex
	// archives remembers the digest of local archives whose digest is
	// costly to compute (docker-save tarballs with uncompressed layers),
	// keyed by the file's identity.
	archives map[fileID]v1.Hash
}

// builds counts root filesystems built, for tests.
var builds atomic.Int64

func (s *Store) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// cacheMeta is the image.json of a prepared image in the cache.
type cacheMeta struct {
	Digest      string            `json:"digest"`
	Ref         string            `json:"ref"` // the reference it was first prepared for
	BuiltAt     string            `json:"builtAt"`
	RootfsBytes int64             `json:"rootfsBytes"`
	Config      v1.Config         `json:"config"` // the image's Env, User, WorkingDir, Entrypoint, Cmd...
	Platform    map[string]string `json:"platform,omitempty"`
}

// Prepare resolves ref to its content digest (for a registry reference the
// manifest digest, fetched; for layouts and archives read locally) and
// returns the cached image for that digest, building it on first use: the
// image's layers flattened (whiteouts applied) into an ext4 root filesystem,
// Dir/<digest hex>/rootfs.img, built in a temporary directory and renamed
// into place under a lock, so that concurrent sessions build it once and a
// failure leaves nothing behind. DefaultRef gives Base. The root is shared by
// every VM booting that digest: attach it read-only.
func (s *Store) Prepare(ctx context.Context, ref string) (*Image, error) {
	if s.Base == nil {
		return nil, errors.New("vmimage: Store has no Base image (the default image's kernel and initramfs)")
	}
	p, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	if p.kind == kindDefault {
		img := *s.Base
		img.Ref = DefaultRef
		return &img, nil
	}
	if s.Dir == "" {
		return nil, errors.New("vmimage: Store has no Dir")
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	// By digest and already prepared: no need to reach the registry.
	if p.digest != nil {
		if img := s.cached(*p.digest, ref); img != nil {
			return img, nil
		}
	}
	src, err := s.open(ctx, p, ref)
	if err != nil {
		return nil, err
	}
	defer src.close()
	if img := s.cached(src.digest, ref); img != nil {
		return img, nil
	}

	hex := src.digest.Hex
	unlock, err := lockPath(ctx, filepath.Join(s.Dir, hex+".lock"), func() {
		s.logf("image %s (%s): waiting for another session preparing it", ref, src.digest)
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	defer unlock()
	if img := s.cached(src.digest, ref); img != nil {
		return img, nil
	}
	if err := s.build(ctx, src, ref); err != nil {
		return nil, fmt.Errorf("image %s (%s): %w", ref, src.digest, err)
	}
	img := s.cached(src.digest, ref)
	if img == nil {
		return nil, fmt.Errorf("image %s (%s): built, but %s is missing", ref, src.digest, filepath.Join(s.Dir, hex, "rootfs.img"))
	}
	return img, nil
}

// cached returns the prepared image for digest d, or nil.
func (s *Store) cached(d v1.Hash, ref string) *Image {
	rootfs := filepath.Join(s.Dir, d.Hex, "rootfs.img")
	if fi, err := os.Stat(rootfs); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	return &Image{Kernel: s.Base.Kernel, Initrd: s.Base.Initrd, Rootfs: rootfs, Digest: d.String(), Ref: ref}
}

// build makes Dir/<hex> for src: extract and mke2fs in Dir/.tmp-<hex>-*,
// then rename. The caller holds the digest's lock.
func (s *Store) build(ctx context.Context, src *source, ref string) (err error) {
	builds.Add(1)
	hex := src.digest.Hex
	final := filepath.Join(s.Dir, hex)
	// Leftovers of a build that crashed (only the lock holder builds).
	if stale, _ := filepath.Glob(filepath.Join(s.Dir, ".tmp-"+hex+"-*")); len(stale) > 0 {
		for _, d := range stale {
			os.RemoveAll(d)
		}
	}
	os.RemoveAll(final) // incomplete: it has no rootfs.img

	cf, err := src.image.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the image config: %w", err)
	}
	if err := checkPlatform(cf); err != nil {
		return err
	}
	start := time.Now()
	s.logf("image %s (%s): first use, building its root filesystem", ref, src.digest)
	tmp, err := os.MkdirTemp(s.Dir, ".tmp-"+hex+"-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	img := src.image
	if src.verify != nil {
		if err := src.verify(ctx); err != nil {
			return err
		}
	}
	if src.spool {
		img = spooledImage{img, tmp}
	}
	rootfs := filepath.Join(tmp, "rootfs.img")
	size, err := buildRootfs(ctx, img, filepath.Join(tmp, "root"), rootfs, s.logf)
	if err != nil {
		return err
	}
	meta := cacheMeta{
		Digest:      src.digest.String(),
		Ref:         ref,
		BuiltAt:     time.Now().UTC().Format(time.RFC3339),
		RootfsBytes: size,
		Config:      cf.Config,
		Platform:    map[string]string{"os": cf.OS, "architecture": cf.Architecture, "variant": cf.Variant},
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "image.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	if err := syncPath(tmp); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	_ = syncPath(s.Dir)
	s.logf("image %s (%s): root filesystem ready in %s (%d MiB)", ref, src.digest, time.Since(start).Round(100*time.Millisecond), size>>20)
	return nil
}

// syncPath flushes a file or directory (and, for a directory, the files in
// it) to disk.
func syncPath(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		entries, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Type().IsRegular() {
				if err := syncPath(filepath.Join(p, e.Name())); err != nil {
					return err
				}
			}
		}
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// lockPath takes an exclusive flock on path, waiting (while ctx allows) for
// another holder; waiting is called once if it has to wait. The returned
// unlock removes the file while still holding the lock, and a locker that
// finds it has locked a removed file tries again, so no lock file is left.
func lockPath(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	warned := false
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil || !errors.Is(err, syscall.EWOULDBLOCK) {
				break
			}
			if !warned && waiting != nil {
				warned = true
				waiting()
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &named) == nil &&
			held.Dev == named.Dev && held.Ino == named.Ino {
			return func() {
				os.Remove(path)
				f.Close()
			}, nil
		}
		f.Close() // the previous holder removed it: lock the new one
	}
}
