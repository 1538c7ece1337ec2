// Package custom prepares custom guest images for the microsandbox strategy:
// a container image (from a registry, an OCI image layout or an image
// archive) flattened into an ext4 root filesystem, once per content digest,
// and cached. cmd/agentconnect-vmimage runs it for the daemon.
package custom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/helper"
	"github.com/agentconnect-md/agentconnect/internal/fileid"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage"
)

// Store prepares custom images in Dir (the daemon's <home>/images), each
// once, identified by content digest. A Store must not be copied after first
// use.
type Store struct {
	Dir string
	// Base is the default image: custom images boot its kernel and initramfs.
	Base *vmimage.Image
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
// failure leaves nothing behind. vmimage.DefaultRef gives Base. The root is shared by
// every VM booting that digest: attach it read-only.
func (s *Store) Prepare(ctx context.Context, ref string) (*vmimage.Image, error) {
	if s.Base == nil {
		return nil, errors.New("custom: Store has no Base image (the default image's kernel and initramfs)")
	}
	p, err := vmimage.ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if p.Kind == vmimage.KindDefault {
		img := *s.Base
		img.Ref = vmimage.DefaultRef
		return &img, nil
	}
	if s.Dir == "" {
		return nil, errors.New("custom: Store has no Dir")
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	// By digest and already prepared: no need to reach the registry.
	if p.Digest != nil {
		if img := s.cached(*p.Digest, ref); img != nil {
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
func (s *Store) cached(d v1.Hash, ref string) *vmimage.Image {
	rootfs := filepath.Join(s.Dir, d.Hex, "rootfs.img")
	if fi, err := os.Stat(rootfs); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	return &vmimage.Image{Kernel: s.Base.Kernel, Initrd: s.Base.Initrd, Rootfs: rootfs, Digest: d.String(), Ref: ref}
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

// ImageMain is agentconnect-vmimage's `image`: the default image, or a
// custom one prepared, for the daemon (api/helper). Progress goes to stderr,
// which the daemon logs.
func ImageMain(stdin io.Reader, stdout, stderr io.Writer) error {
	logf := log.New(stderr, "", 0).Printf
	return helper.Serve(stdin, stdout, func(req helper.ImageRequest) helper.ImageResponse {
		// The default image's answer is its files': their versions from
		// before and after the read, when they agree, let the daemon keep
		// it. A custom one is asked for each time (a tag can move).
		before, berr := defaultInputs(req)
		img, err := vmimage.Default(req.ImageDir)
		if err == nil && req.Ref != "" {
			store := &Store{Dir: req.ImagesDir, Base: img, Logf: logf}
			img, err = store.Prepare(context.Background(), req.Ref)
		}
		if err != nil {
			return helper.ImageResponse{Error: err.Error()}
		}
		resp := helper.ImageResponse{Kernel: img.Kernel, Initrd: img.Initrd, Rootfs: img.Rootfs, Digest: img.Digest, Runtimes: img.Runtimes}
		if len(before) > 0 && berr == nil {
			if after, err := defaultInputs(req); err == nil && slices.Equal(before, after) {
				resp.Inputs = after
			}
		}
		return resp
	})
}

// defaultInputs is the versions of the files the answer to req is read
// from when it asks for the default image; none for a custom one, whose
// answer is not kept.
func defaultInputs(req helper.ImageRequest) ([]fileid.ID, error) {
	if req.Ref != "" {
		return nil, nil
	}
	return fileid.All(vmimage.DefaultFiles(req.ImageDir))
}
