package custom

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage"
)

// guestPlatform is the platform the guest runs: the host's architecture.
var guestPlatform = v1.Platform{OS: "linux", Architecture: runtime.GOARCH}

// source is a resolved image: its content digest and the image to read.
type source struct {
	digest v1.Hash
	image  v1.Image
	close  func()
	// verify, if set, checks the layers' blobs against their digests
	// before they are extracted.
	verify func(context.Context) error
	// spool: download each layer and check it before extracting it.
	spool bool
}

func (s *Store) open(ctx context.Context, p vmimage.Ref, ref string) (*source, error) {
	switch p.Kind {
	case vmimage.KindRegistry:
		return openRegistry(ctx, p, ref)
	case vmimage.KindLayout:
		return openLayout(p, ref)
	case vmimage.KindArchive:
		return s.openArchive(p, ref)
	}
	return nil, fmt.Errorf("image %q: unknown kind of reference", ref)
}

// openRegistry fetches the manifest (resolving an index to the guest's
// platform); layers are fetched when the image is built, and verified
// against their digests as they are read.
func openRegistry(ctx context.Context, p vmimage.Ref, ref string) (*source, error) {
	img, err := remote.Image(p.Named,
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(guestPlatform),
		remote.WithUserAgent("agentconnect"))
	if err != nil {
		return nil, fmt.Errorf("image %s: fetching the manifest from %s: %w", ref, p.Named.Context().RegistryStr(), err)
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	return &source{digest: d, image: img, close: func() {}, spool: true}, nil
}

// blobStore reads the files of an OCI image layout: index.json and
// blobs/<alg>/<hex>, from a directory or from a tarball.
type blobStore interface {
	open(name string) (io.ReadCloser, error)
	describe() string
}

type dirStore string

func (d dirStore) open(name string) (io.ReadCloser, error) {
	return os.Open(filepath.Join(string(d), filepath.FromSlash(name)))
}
func (d dirStore) describe() string { return "OCI layout " + string(d) }

func openLayout(p vmimage.Ref, ref string) (*source, error) {
	st := dirStore(p.Path)
	if _, err := os.Stat(filepath.Join(p.Path, "index.json")); err != nil {
		return nil, errdefs.InvalidArgument("image %s: %s is not an OCI image layout (no index.json): %v", ref, p.Path, err)
	}
	return openOCI(st, p.Digest, ref)
}

// openOCI resolves an OCI layout (from index.json, or the manifest named by
// want) to one image manifest for the guest's platform.
func openOCI(st blobStore, want *v1.Hash, ref string) (*source, error) {
	var desc v1.Descriptor
	if want != nil {
		desc = v1.Descriptor{Digest: *want}
	} else {
		rc, err := st.open("index.json")
		if err != nil {
			return nil, errdefs.InvalidArgument("image %s: %s: %v", ref, st.describe(), err)
		}
		idx, err := v1.ParseIndexManifest(rc)
		rc.Close()
		if err != nil {
			return nil, errdefs.InvalidArgument("image %s: %s: index.json: %v", ref, st.describe(), err)
		}
		d, err := pickManifest(idx.Manifests, ref, true)
		if err != nil {
			return nil, err
		}
		desc = d
	}
	for depth := 0; ; depth++ {
		raw, err := readBlob(st, desc.Digest, -1)
		if err != nil {
			return nil, errdefs.InvalidArgument("image %s: %s: manifest %s: %v", ref, st.describe(), desc.Digest, err)
		}
		var probe struct {
			MediaType types.MediaType `json:"mediaType"`
			Manifests json.RawMessage `json:"manifests"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return nil, errdefs.InvalidArgument("image %s: %s: manifest %s is not JSON: %v", ref, st.describe(), desc.Digest, err)
		}
		mt := probe.MediaType
		if mt == "" {
			mt = desc.MediaType
		}
		if mt.IsIndex() || (mt == "" && probe.Manifests != nil) {
			if depth > 4 {
				return nil, errdefs.InvalidArgument("image %s: %s: image indexes nested too deep", ref, st.describe())
			}
			idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
			if err != nil {
				return nil, errdefs.InvalidArgument("image %s: %s: index %s: %v", ref, st.describe(), desc.Digest, err)
			}
			if desc, err = pickManifest(idx.Manifests, ref, false); err != nil {
				return nil, err
			}
			continue
		}
		m, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return nil, errdefs.InvalidArgument("image %s: %s: manifest %s: %v", ref, st.describe(), desc.Digest, err)
		}
		if mt == "" {
			mt = types.OCIManifestSchema1
		}
		if !mt.IsImage() {
			return nil, errdefs.InvalidArgument("image %s: %s: %s is a %s, not an image manifest", ref, st.describe(), desc.Digest, mt)
		}
		oi := &ociImage{st: st, raw: raw, manifest: m, mediaType: mt}
		img, err := partial.CompressedToImage(oi)
		if err != nil {
			return nil, err
		}
		return &source{digest: desc.Digest, image: img, close: func() {}, verify: oi.verify}, nil
	}
}

// pickManifest chooses the guest's image among an index's manifests: the
// only one, or the only one for the guest's platform (attestations and other
// platforms left aside).
func pickManifest(all []v1.Descriptor, ref string, top bool) (v1.Descriptor, error) {
	var cands []v1.Descriptor
	seen := map[v1.Hash]bool{}
	for _, d := range all {
		if seen[d.Digest] {
			continue // one image under several names
		}
		seen[d.Digest] = true
		if d.Annotations["vnd.docker.reference.type"] != "" {
			continue // an attestation
		}
		if d.Platform != nil && (d.Platform.OS != "" || d.Platform.Architecture != "") && !d.Platform.Satisfies(guestPlatform) {
			continue
		}
		cands = append(cands, d)
	}
	if len(cands) == 1 {
		return cands[0], nil
	}
	// Several: prefer the ones that name the guest's platform.
	var exact []v1.Descriptor
	for _, d := range cands {
		if d.Platform != nil && d.Platform.Satisfies(guestPlatform) {
			exact = append(exact, d)
		}
	}
	if len(exact) == 1 {
		return exact[0], nil
	}
	if len(cands) == 0 {
		return v1.Descriptor{}, errdefs.InvalidArgument("image %s has no image for %s/%s", ref, guestPlatform.OS, guestPlatform.Architecture)
	}
	var names []string
	for _, d := range cands {
		n := d.Digest.String()
		if r := d.Annotations["org.opencontainers.image.ref.name"]; r != "" {
			n += " (" + r + ")"
		} else if r := d.Annotations["io.containerd.image.name"]; r != "" {
			n += " (" + r + ")"
		}
		names = append(names, n)
	}
	sort.Strings(names)
	hint := ""
	if top {
		hint = ": choose one with oci:PATH@sha256:..."
	}
	return v1.Descriptor{}, errdefs.InvalidArgument("image %s holds %d images (%s)%s", ref, len(cands), strings.Join(names, ", "), hint)
}

// readBlob reads a small blob (a manifest or config) and checks its digest.
func readBlob(st blobStore, h v1.Hash, size int64) ([]byte, error) {
	if h.Algorithm != "sha256" {
		return nil, fmt.Errorf("unsupported digest algorithm %q", h.Algorithm)
	}
	rc, err := st.open("blobs/sha256/" + h.Hex)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return nil, err
	}
	if sum := fmt.Sprintf("%x", sha256.Sum256(b)); sum != h.Hex {
		return nil, fmt.Errorf("blob %s is corrupt (its content hashes to sha256:%s)", h, sum)
	}
	if size >= 0 && int64(len(b)) != size {
		return nil, fmt.Errorf("blob %s has %d bytes, the manifest says %d", h, len(b), size)
	}
	return b, nil
}

// ociImage is an image manifest read from a blobStore (partial.CompressedImageCore).
type ociImage struct {
	st        blobStore
	raw       []byte
	manifest  *v1.Manifest
	mediaType types.MediaType
}

func (i *ociImage) RawConfigFile() ([]byte, error) {
	return readBlob(i.st, i.manifest.Config.Digest, i.manifest.Config.Size)
}
func (i *ociImage) MediaType() (types.MediaType, error) { return i.mediaType, nil }
func (i *ociImage) RawManifest() ([]byte, error)        { return i.raw, nil }
func (i *ociImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == i.manifest.Config.Digest {
		return &ociLayer{st: i.st, desc: i.manifest.Config}, nil
	}
	for _, d := range i.manifest.Layers {
		if d.Digest == h {
			return &ociLayer{st: i.st, desc: d}, nil
		}
	}
	return nil, fmt.Errorf("blob %s is not in the manifest", h)
}

// verify checks every layer blob against its digest.
func (i *ociImage) verify(ctx context.Context) error {
	for _, d := range i.manifest.Layers {
		rc, err := (&ociLayer{st: i.st, desc: d}).Compressed()
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, ctxReader{ctx, rc})
		rc.Close()
		if err != nil {
			return fmt.Errorf("%s: layer %s: %w", i.st.describe(), d.Digest, err)
		}
	}
	return nil
}

// ociLayer is a layer blob, verified against its digest as it is read.
type ociLayer struct {
	st   blobStore
	desc v1.Descriptor
}

func (l *ociLayer) Digest() (v1.Hash, error)            { return l.desc.Digest, nil }
func (l *ociLayer) Size() (int64, error)                { return l.desc.Size, nil }
func (l *ociLayer) MediaType() (types.MediaType, error) { return l.desc.MediaType, nil }
func (l *ociLayer) Compressed() (io.ReadCloser, error) {
	if l.desc.Digest.Algorithm != "sha256" {
		return nil, fmt.Errorf("layer %s: unsupported digest algorithm", l.desc.Digest)
	}
	rc, err := l.st.open("blobs/sha256/" + l.desc.Digest.Hex)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", l.desc.Digest, err)
	}
	return &verifyReader{rc: rc, h: sha256.New(), want: l.desc.Digest, size: l.desc.Size}, nil
}

// verifyReader fails at the end of a blob whose content does not match its
// digest (or size), instead of returning io.EOF.
type verifyReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
	size int64
	n    int64
}

func (v *verifyReader) Read(p []byte) (int, error) {
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if err == io.EOF {
		if sum := fmt.Sprintf("%x", v.h.Sum(nil)); sum != v.want.Hex {
			return n, fmt.Errorf("blob %s is corrupt (its content hashes to sha256:%s)", v.want, sum)
		}
		if v.size > 0 && v.n != v.size {
			return n, fmt.Errorf("blob %s has %d bytes, the manifest says %d", v.want, v.n, v.size)
		}
	}
	return n, err
}
func (v *verifyReader) Close() error { return v.rc.Close() }

// --- archives

// fileID identifies a file's content for as long as it is not rewritten.
type fileID struct {
	dev, ino    uint64
	size, mtime int64
}

func (s *Store) openArchive(p vmimage.Ref, ref string) (*source, error) {
	f, err := os.Open(p.Path)
	if err != nil {
		return nil, errdefs.InvalidArgument("image %s: %v", ref, err)
	}
	var magic [4]byte
	n, _ := io.ReadFull(f, magic[:])
	switch {
	case n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		f.Close()
		return nil, errdefs.InvalidArgument("image %s: %s is gzip-compressed: decompress it (gunzip) and use the .tar", ref, p.Path)
	case n == 4 && bytes.Equal(magic[:], []byte{0x28, 0xb5, 0x2f, 0xfd}):
		f.Close()
		return nil, errdefs.InvalidArgument("image %s: %s is zstd-compressed: decompress it (zstd -d) and use the .tar", ref, p.Path)
	}
	entries, err := indexTar(f)
	if err != nil {
		f.Close()
		return nil, errdefs.InvalidArgument("image %s: %s is not a tar archive: %v", ref, p.Path, err)
	}
	if _, ok := entries["index.json"]; ok {
		// An OCI image layout in a tarball (docker save since Docker 25
		// writes one too): its manifests keep their digests.
		src, err := openOCI(&tarStore{f: f, entries: entries, name: p.Path}, nil, ref)
		if err != nil {
			f.Close()
			return nil, err
		}
		src.close = func() { f.Close() }
		return src, nil
	}
	f.Close()
	if _, ok := entries["manifest.json"]; !ok {
		return nil, errdefs.InvalidArgument("image %s: %s is neither a docker-save nor an OCI image archive (it has no manifest.json or index.json)", ref, p.Path)
	}
	// docker save (before Docker 25): the manifest is computed from the
	// layers, compressing them first if the tarball holds them uncompressed,
	// which is slow: remember the result while the file is unchanged.
	img, err := tarball.ImageFromPath(p.Path, nil)
	if err != nil {
		return nil, errdefs.InvalidArgument("image %s: %s: %v", ref, p.Path, err)
	}
	id, idErr := identify(p.Path)
	if idErr == nil {
		s.mu.Lock()
		d, ok := s.archives[id]
		s.mu.Unlock()
		if ok {
			return &source{digest: d, image: img, close: func() {}}, nil
		}
	}
	d, err := img.Digest()
	if err != nil {
		return nil, errdefs.InvalidArgument("image %s: %s: %v", ref, p.Path, err)
	}
	if idErr == nil {
		s.mu.Lock()
		if s.archives == nil {
			s.archives = map[fileID]v1.Hash{}
		}
		s.archives[id] = d
		s.mu.Unlock()
	}
	return &source{digest: d, image: img, close: func() {}}, nil
}

func identify(p string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}, nil
}

type section struct{ off, size int64 }

// indexTar lists a tar's regular files and where their data lies.
func indexTar(f *os.File) (map[string]section, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	entries := map[string]section{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		entries[path.Clean(strings.TrimPrefix(h.Name, "/"))] = section{off, h.Size}
	}
	if len(entries) == 0 {
		return nil, errors.New("no files in it")
	}
	return entries, nil
}

// tarStore reads an OCI image layout inside a tarball.
type tarStore struct {
	f       *os.File
	entries map[string]section
	name    string
}

func (t *tarStore) open(name string) (io.ReadCloser, error) {
	s, ok := t.entries[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return io.NopCloser(io.NewSectionReader(t.f, s.off, s.size)), nil
}
func (t *tarStore) describe() string { return "OCI archive " + t.name }

func checkPlatform(cf *v1.ConfigFile) error {
	if cf.OS != "" && cf.OS != guestPlatform.OS {
		return errdefs.InvalidArgument("the image is for %s, the guest runs %s", cf.OS, guestPlatform.OS)
	}
	if cf.Architecture != "" && cf.Architecture != guestPlatform.Architecture {
		return errdefs.InvalidArgument("the image is for %s/%s, the guest is %s/%s", cf.OS, cf.Architecture, guestPlatform.OS, guestPlatform.Architecture)
	}
	return nil
}
