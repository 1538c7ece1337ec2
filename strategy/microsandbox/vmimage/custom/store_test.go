package custom

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/agentconnect-md/agentconnect/api/helper"
	"github.com/agentconnect-md/agentconnect/internal/fileid"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage"
)

func needTools(t *testing.T) {
	t.Helper()
	for _, p := range []string{"mke2fs", "debugfs"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (Debian package e2fsprogs)", p)
		}
	}
}

// --- a registry on loopback that can serve a corrupt blob

type testRegistry struct {
	srv  *httptest.Server
	host string
	mu   sync.Mutex
	bad  map[string][]byte // digest -> what to serve instead
}

func newRegistry(t *testing.T) *testRegistry {
	r := &testRegistry{bad: map[string][]byte{}}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/sha256:") {
			r.mu.Lock()
			b, ok := r.bad[path.Base(req.URL.Path)]
			r.mu.Unlock()
			if ok {
				w.Header().Set("Content-Length", fmt.Sprint(len(b)))
				w.WriteHeader(http.StatusOK)
				w.Write(b)
				return
			}
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

func (r *testRegistry) push(t *testing.T, img v1.Image, repoTag string) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref.String()
}

// --- a small image: two layers, the upper one deleting and replacing files

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
	pax              map[string]string
}

func layerOf(t *testing.T, entries []entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, Size: int64(len(e.body)), ModTime: mtime, Devmajor: e.major, Devminor: e.minor, PAXRecords: e.pax}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testImage(t *testing.T, arch, marker string) v1.Image {
	t.Helper()
	lower := layerOf(t, []entry{
		{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		{name: "etc/hostname", body: "lower\n", mode: 0o644},
		{name: "etc/removed", body: "whited out\n", mode: 0o644},
		{name: "opt/", typ: tar.TypeDir, mode: 0o755},
		{name: "opt/old", body: "hidden by an opaque dir\n", mode: 0o644},
		{name: "usr/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/bin/", typ: tar.TypeDir, mode: 0o755},
		{name: "usr/bin/su", body: "#!/bin/sh\n", mode: 0o4755},
		{name: "usr/bin/tool", body: "tool\n", mode: 0o750, uid: 1000, gid: 1001},
		{name: "usr/bin/tool2", typ: tar.TypeLink, link: "usr/bin/tool"},
		{name: "usr/bin/ping", body: "ping\n", mode: 0o755, pax: map[string]string{
			"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
			"SCHILY.xattr.user.note":           "hello",
		}},
		{name: "home/", typ: tar.TypeDir, mode: 0o755},
		{name: "home/user/", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1001},
		{name: "home/user/.profile", body: "PS1=x\n", mode: 0o600, uid: 1000, gid: 1001},
		{name: "dev/", typ: tar.TypeDir, mode: 0o755},
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		{name: "run/fifo", typ: tar.TypeFifo, mode: 0o620, gid: 5},
	})
	upper := layerOf(t, []entry{
		{name: "etc/.wh.removed", mode: 0o644},
		{name: "etc/hostname", body: "upper " + marker + "\n", mode: 0o644},
		{name: "hostname", typ: tar.TypeSymlink, link: "etc/hostname"},
		{name: "long", typ: tar.TypeSymlink, link: "/" + strings.Repeat("x", 100)},
		{name: "opt/.wh..wh..opq", mode: 0o644},
		{name: "opt/new", body: "new\n", mode: 0o644},
	})
	img, err := mutate.AppendLayers(empty.Image, lower, upper)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/usr/bin:/bin"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func newStore(t *testing.T) *Store {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	return &Store{
		Dir:  filepath.Join(dir, "images"),
		Base: &vmimage.Image{Kernel: filepath.Join(base, "vmlinuz"), Initrd: filepath.Join(base, "initrd.img"), Rootfs: filepath.Join(base, "rootfs.img"), Digest: "sha256:" + strings.Repeat("0", 64), Ref: vmimage.DefaultRef},
		Logf: t.Logf,
	}
}

// --- reading an ext4 image with debugfs, no mounting

func debugfs(t *testing.T, img, req string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", req, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v: %s", req, err, out)
	}
	return strings.TrimPrefix(string(out), "debugfs 1.47.0 (5-Feb-2023)\n")
}

var statLine = regexp.MustCompile(`Type: (\S+(?: special)?)\s+Mode:\s+(\d+).*\n.*\nUser:\s+(\d+)\s+Group:\s+(\d+)`)

// stat gives "type mode uid:gid" of a path in the image.
func stat(t *testing.T, img, p string) string {
	t.Helper()
	out := debugfs(t, img, "stat "+p)
	m := statLine.FindStringSubmatch(out)
	if m == nil {
		return strings.TrimSpace(out)
	}
	return fmt.Sprintf("%s %s %s:%s", m[1], m[2], m[3], m[4])
}

func checkRoot(t *testing.T, img, marker string) {
	t.Helper()
	if got := debugfs(t, img, "cat /etc/hostname"); got != "upper "+marker+"\n" {
		t.Errorf("/etc/hostname = %q, want the upper layer's", got)
	}
	if got := debugfs(t, img, "cat /usr/bin/tool2"); got != "tool\n" {
		t.Errorf("/usr/bin/tool2 (a hard link) = %q", got)
	}
	if got := debugfs(t, img, "cat /opt/new"); got != "new\n" {
		t.Errorf("/opt/new = %q", got)
	}
	for _, gone := range []string{"/etc/removed", "/opt/old", "/etc/.wh.removed", "/opt/.wh..wh..opq"} {
		if got := debugfs(t, img, "stat "+gone); !strings.Contains(got, "not found") {
			t.Errorf("%s is in the image: %s", gone, stat(t, img, gone))
		}
	}
	if got := debugfs(t, img, "stat /hostname"); !strings.Contains(got, `Fast link dest: "etc/hostname"`) {
		t.Errorf("/hostname is not the symlink to etc/hostname: %s", got)
	}
	if got := debugfs(t, img, "stat /long"); !strings.Contains(got, "Type: symlink") || !strings.Contains(got, "Size: 101") {
		t.Errorf("/long is not the long symlink: %s", got)
	}
	for p, want := range map[string]string{
		"/":                   "directory 0755 0:0",
		"/etc/hostname":       "regular 0644 0:0",
		"/usr/bin/su":         "regular 04755 0:0",
		"/usr/bin/tool":       "regular 0750 1000:1001",
		"/home/user":          "directory 0700 1000:1001",
		"/home/user/.profile": "regular 0600 1000:1001",
		"/dev/null":           "character special 0666 0:0",
		"/run":                "directory 0755 0:0", // made for run/fifo, not listed in the layer
		"/run/fifo":           "FIFO 0620 0:5",
	} {
		if got := stat(t, img, p); got != want {
			t.Errorf("stat %s = %q, want %q", p, got, want)
		}
	}
	if got := debugfs(t, img, "stat /dev/null"); !strings.Contains(got, "Device major/minor number: 01:03") {
		t.Errorf("/dev/null is not 1:3: %s", got)
	}
	if got := debugfs(t, img, "ea_list /usr/bin/ping"); !strings.Contains(got, "security.capability (20) = 01 00 00 02 00 20 00 00") || !strings.Contains(got, `user.note (5) = "hello"`) {
		t.Errorf("/usr/bin/ping lost its extended attributes: %s", got)
	}
	if got := debugfs(t, img, "ls -l /"); !strings.Contains(got, "etc") || !strings.Contains(got, "hostname") {
		t.Errorf("ls -l / = %s", got)
	}
}

func TestPrepareFromRegistry(t *testing.T) {
	needTools(t)
	reg := newRegistry(t)
	img := testImage(t, "amd64", "one")
	ref := reg.push(t, img, "test/image:v1")
	s := newStore(t)
	ctx := context.Background()

	n := builds.Load()
	got, err := s.Prepare(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if builds.Load() != n+1 {
		t.Errorf("%d builds, want 1", builds.Load()-n)
	}
	want := digestOf(t, img)
	if got.Digest != want || got.Ref != ref || got.Kernel != s.Base.Kernel || got.Initrd != s.Base.Initrd {
		t.Errorf("Prepare = %+v, want digest %s, the base's kernel and initrd", got, want)
	}
	if got.Rootfs != filepath.Join(s.Dir, strings.TrimPrefix(want, "sha256:"), "rootfs.img") {
		t.Errorf("Rootfs = %s", got.Rootfs)
	}
	checkRoot(t, got.Rootfs, "one")
	fi, err := os.Stat(got.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(s.Dir)
	if len(entries) != 1 {
		t.Errorf("Dir holds %d entries, want the image's directory alone: %v", len(entries), entries)
	}

	// A second tag of the same content: same digest, no rebuild.
	ref2 := reg.push(t, img, "other/name:v2")
	again, err := s.Prepare(ctx, ref2)
	if err != nil {
		t.Fatal(err)
	}
	fi2, _ := os.Stat(again.Rootfs)
	if again.Digest != want || again.Rootfs != got.Rootfs || builds.Load() != n+1 || !fi2.ModTime().Equal(fi.ModTime()) {
		t.Errorf("second tag: %+v, %d builds; want the same cached image", again, builds.Load()-n)
	}

	// By digest, once prepared: the registry is not needed any more.
	reg.srv.Close()
	byDigest := reg.host + "/test/image@" + want
	if _, err := s.Prepare(ctx, byDigest); err != nil {
		t.Errorf("Prepare(%s) with the registry gone: %v", byDigest, err)
	}
	if _, err := s.Prepare(ctx, ref); err == nil {
		t.Errorf("Prepare by tag with the registry gone succeeded")
	} else {
		t.Logf("by tag with the registry gone: %v", err)
	}
}

func TestPrepareRootless(t *testing.T) {
	needTools(t)
	if !ownersByDebugfs {
		ownersByDebugfs = true
		t.Cleanup(func() { ownersByDebugfs = false })
	}
	reg := newRegistry(t)
	ref := reg.push(t, testImage(t, "amd64", "rootless"), "test/rootless:v1")
	got, err := newStore(t).Prepare(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	checkRoot(t, got.Rootfs, "rootless")
}

func TestLayoutAndArchives(t *testing.T) {
	needTools(t)
	reg := newRegistry(t)
	img := testImage(t, "amd64", "local")
	want := digestOf(t, img)
	regRef := reg.push(t, img, "test/local:v1")
	tmp := t.TempDir()
	ctx := context.Background()

	// An OCI layout directory.
	dir := filepath.Join(tmp, "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	// A docker-save tarball, as go-containerregistry writes it.
	archive := filepath.Join(tmp, "image.tar")
	tag, _ := name.NewTag("test/local:v1")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	// An OCI layout in a tarball (what skopeo or docker save >= 25 write).
	ociArchive := filepath.Join(tmp, "oci.tar")
	if out, err := exec.Command("tar", "-C", dir, "-cf", ociArchive, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, out)
	}

	s := newStore(t)
	n := builds.Load()
	for _, ref := range []string{"oci:" + dir, "oci:" + dir + "@" + want, "archive:" + archive, "archive:" + ociArchive, regRef} {
		got, err := s.Prepare(ctx, ref)
		if err != nil {
			t.Errorf("Prepare(%s): %v", ref, err)
			continue
		}
		if got.Digest != want {
			t.Errorf("Prepare(%s) = digest %s, want %s (the registry's)", ref, got.Digest, want)
		}
		checkRoot(t, got.Rootfs, "local")
	}
	if b := builds.Load() - n; b != 1 {
		t.Errorf("%d builds for one content, want 1", b)
	}

	// A docker-save tarball holds no manifest: go-containerregistry makes a
	// Docker schema 2 one from its files, so an image whose manifest was
	// anything else (OCI media types, annotations) gets another digest
	// there, and is built again. An OCI archive keeps the manifest.
	ociTyped := mutate.ConfigMediaType(mutate.MediaType(img, types.OCIManifestSchema1), types.OCIConfigJSON)
	ociTypedArchive := filepath.Join(tmp, "oci-typed.tar")
	if err := tarball.WriteToFile(ociTypedArchive, tag, ociTyped); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Prepare(ctx, "archive:"+ociTypedArchive); err != nil {
		t.Errorf("Prepare(docker-save of an OCI image): %v", err)
	} else {
		if got.Digest == digestOf(t, ociTyped) {
			t.Errorf("docker-save of an OCI image kept its digest: the limitation is gone, update the docs")
		}
		checkRoot(t, got.Rootfs, "local")
	}

	// A layout with two images needs a digest.
	other := testImage(t, "amd64", "other")
	if err := lp.AppendImage(other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, "oci:"+dir); err == nil || !strings.Contains(err.Error(), "oci:PATH@sha256:") {
		t.Errorf("layout with two images: %v, want an error asking for a digest", err)
	}
	got, err := s.Prepare(ctx, "oci:"+dir+"@"+digestOf(t, other))
	if err != nil {
		t.Fatal(err)
	}
	checkRoot(t, got.Rootfs, "other")

	// A corrupt blob in a layout is an error, and nothing is left.
	s2 := newStore(t)
	layers, _ := other.Layers()
	ld, _ := layers[1].Digest()
	blob := filepath.Join(dir, "blobs", "sha256", ld.Hex)
	b, _ := os.ReadFile(blob)
	b[len(b)/2] ^= 0xff
	os.WriteFile(blob, b, 0o644)
	prepareFails(t, s2, "oci:"+dir+"@"+digestOf(t, other), "corrupt")
}

func TestIndexPicksGuestPlatform(t *testing.T) {
	needTools(t)
	reg := newRegistry(t)
	amd := testImage(t, "amd64", "amd64")
	arm := testImage(t, "arm64", "arm64")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}})
	ref, _ := name.ParseReference(reg.host + "/multi/image:latest")
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	got, err := s.Prepare(context.Background(), ref.String())
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != digestOf(t, amd) {
		t.Errorf("digest %s, want the amd64 image's %s", got.Digest, digestOf(t, amd))
	}
	checkRoot(t, got.Rootfs, "amd64")

	// An image for another architecture alone is refused, leaving nothing.
	armRef := reg.push(t, arm, "arm/only:latest")
	s2 := newStore(t)
	prepareFails(t, s2, armRef, "arm64")
}

func TestCorruptLayerLeavesNothing(t *testing.T) {
	needTools(t)
	reg := newRegistry(t)
	img := testImage(t, "amd64", "corrupt")
	ref := reg.push(t, img, "test/corrupt:v1")
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		rc, _ := l.Compressed()
		b, _ := io.ReadAll(rc)
		rc.Close()
		b[len(b)/2] ^= 0xff
		reg.bad[d.String()] = b
	}
	s := newStore(t)
	prepareFails(t, s, ref, ref, "digest")
}

func TestConcurrentPrepareBuildsOnce(t *testing.T) {
	needTools(t)
	reg := newRegistry(t)
	ref := reg.push(t, testImage(t, "amd64", "concurrent"), "test/concurrent:v1")
	s := newStore(t)
	// A second Store on the same directory: another daemon process, as far
	// as locking goes.
	s2 := &Store{Dir: s.Dir, Base: s.Base, Logf: t.Logf}
	n := builds.Load()
	var wg sync.WaitGroup
	imgs := make([]*vmimage.Image, 4)
	errs := make([]error, 4)
	for i := range imgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := s
			if i%2 == 1 {
				st = s2
			}
			imgs[i], errs[i] = st.Prepare(context.Background(), ref)
		}()
	}
	wg.Wait()
	for i := range imgs {
		if errs[i] != nil {
			t.Fatalf("Prepare %d: %v", i, errs[i])
		}
		if imgs[i].Rootfs != imgs[0].Rootfs {
			t.Errorf("Prepare %d: %s, want %s", i, imgs[i].Rootfs, imgs[0].Rootfs)
		}
	}
	if b := builds.Load() - n; b != 1 {
		t.Errorf("%d builds, want 1", b)
	}
	if entries, _ := os.ReadDir(s.Dir); len(entries) != 1 {
		t.Errorf("Dir holds %v, want the image's directory alone (no lock or temporary files)", entries)
	}
}

func TestPrepareCanceled(t *testing.T) {
	needTools(t)
	reg := newRegistry(t)
	ref := reg.push(t, testImage(t, "amd64", "cancel"), "test/cancel:v1")
	s := newStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Prepare(ctx, ref); !errors.Is(err, context.Canceled) {
		t.Errorf("Prepare with a canceled context: %v", err)
	}
	checkEmpty(t, s)
}

func TestBadArchives(t *testing.T) {
	tmp := t.TempDir()
	s := newStore(t)
	gz := filepath.Join(tmp, "image.tar.gz")
	os.WriteFile(gz, []byte{0x1f, 0x8b, 8, 0, 0, 0}, 0o644)
	notTar := filepath.Join(tmp, "notes.txt")
	os.WriteFile(notTar, bytes.Repeat([]byte("hello "), 200), 0o644)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "README", Size: 2, Mode: 0o644, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.Close()
	other := filepath.Join(tmp, "other.tar")
	os.WriteFile(other, buf.Bytes(), 0o644)
	for ref, want := range map[string]string{
		"archive:" + gz:     "gzip-compressed",
		"archive:" + notTar: "not a tar archive",
		"archive:" + other:  "neither a docker-save nor an OCI image archive",
		"oci:" + tmp:        "not an OCI image layout",
	} {
		prepareFails(t, s, ref, want)
	}
	if got, err := s.Prepare(context.Background(), vmimage.DefaultRef); err != nil || !reflect.DeepEqual(*got, *s.Base) {
		t.Errorf("Prepare(default) = %+v, %v; want the base image", got, err)
	}
	checkEmpty(t, s)
}

// prepareFails checks that Prepare(ref) fails with an error containing
// every one of wants, and leaves nothing in the store.
func prepareFails(t *testing.T, s *Store, ref string, wants ...string) {
	t.Helper()
	_, err := s.Prepare(context.Background(), ref)
	if err == nil {
		t.Errorf("Prepare(%s) succeeded, want an error saying %q", ref, wants)
		return
	}
	t.Logf("Prepare(%s): %v", ref, err)
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Prepare(%s) = %v, want an error saying %q", ref, err, w)
		}
	}
	checkEmpty(t, s)
}

// checkEmpty fails if a failed or canceled Prepare left anything behind.
func checkEmpty(t *testing.T, s *Store) {
	t.Helper()
	if entries, _ := os.ReadDir(s.Dir); len(entries) != 0 {
		t.Errorf("left in the store's directory after a failure: %v", entries)
	}
}

// The default image's answer names the files it was read from, as they
// were, so that the daemon can keep it; a custom image's does not (a tag
// can move), nor does an error.
func TestImageMainInputs(t *testing.T) {
	needTools(t)
	dir := t.TempDir()
	files := vmimage.DefaultFiles(dir)
	os.WriteFile(files[0], []byte(`{"rootfsDigest": "sha256:`+strings.Repeat("c", 64)+`"}`), 0o644)
	for _, f := range files[1:] {
		os.WriteFile(f, []byte("x"), 0o644)
	}
	ask := func(req helper.ImageRequest) helper.ImageResponse {
		t.Helper()
		in, _ := json.Marshal(req)
		var out, stderr bytes.Buffer
		if err := ImageMain(bytes.NewReader(in), &out, &stderr); err != nil {
			t.Fatalf("ImageMain(%+v): %v; %s", req, err, stderr.Bytes())
		}
		var resp helper.ImageResponse
		if err := json.Unmarshal(out.Bytes(), &resp); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := ask(helper.ImageRequest{ImageDir: dir, ImagesDir: filepath.Join(dir, "images")})
	want, err := fileid.All(files)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Error != "" || !reflect.DeepEqual(resp.Inputs, want) {
		t.Errorf("default image: error %q, inputs %+v; want the four files %+v", resp.Error, resp.Inputs, want)
	}

	layoutDir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(testImage(t, "amd64", "inputs")); err != nil {
		t.Fatal(err)
	}
	resp = ask(helper.ImageRequest{ImageDir: dir, ImagesDir: filepath.Join(dir, "images"), Ref: "oci:" + layoutDir})
	if resp.Error != "" || resp.Rootfs == "" || len(resp.Inputs) != 0 {
		t.Errorf("custom image: error %q, rootfs %q, inputs %+v; want a root and no inputs", resp.Error, resp.Rootfs, resp.Inputs)
	}
	os.Remove(files[1])
	if resp = ask(helper.ImageRequest{ImageDir: dir}); resp.Error == "" || len(resp.Inputs) != 0 {
		t.Errorf("no kernel: error %q, inputs %+v; want an error and no inputs", resp.Error, resp.Inputs)
	}
}
