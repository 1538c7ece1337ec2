package integration

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImageModulesCarryNoSignature: the image's initramfs holds the kernel
// modules a VM loads at every start without their appended signatures
// (scripts/build-image.sh, unsign): the guest kernel would hash and verify
// each in emulation under TCG (~160 ms of a start) and enforces nothing.
// The modules are there and whole otherwise: each still starts as an ELF.
func TestImageModulesCarryNoSignature(t *testing.T) {
	path := filepath.Join(binDir, "image", "initrd.img")
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("no guest image (%v); make image builds it, make test does", err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	data, err := io.ReadAll(gz)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	modules := 0
	for name, body := range cpioFiles(t, data) {
		if !strings.HasSuffix(name, ".ko") {
			continue
		}
		modules++
		if !bytes.HasPrefix(body, []byte("\x7fELF")) {
			t.Errorf("%s is not an ELF object", name)
		}
		if bytes.HasSuffix(body, []byte("~Module signature appended~\n")) {
			t.Errorf("%s still carries its signature", name)
		}
	}
	if modules < 10 {
		t.Errorf("the initramfs holds %d kernel modules; want the virtio, vsock, fuse and overlay ones (10 or more)", modules)
	}
}

// cpioFiles reads a newc cpio archive: the regular files, by name.
func cpioFiles(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	hex := func(b []byte) int {
		n, err := strconv.ParseUint(string(b), 16, 32)
		if err != nil {
			t.Fatalf("cpio header field %q: %v", b, err)
		}
		return int(n)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; off+110 <= len(data); {
		h := data[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("cpio: no newc header at %d", off)
		}
		mode, size, nameSize := hex(h[14:22]), hex(h[54:62]), hex(h[94:102])
		nameEnd := off + 110 + nameSize
		if nameEnd > len(data) {
			t.Fatal("cpio: truncated name")
		}
		name := string(data[off+110 : nameEnd-1])
		if name == "TRAILER!!!" {
			break
		}
		body := align(nameEnd)
		if body+size > len(data) {
			t.Fatalf("cpio: %s truncated", name)
		}
		if mode&0o170000 == 0o100000 {
			files[name] = data[body : body+size]
		}
		off = align(body + size)
	}
	return files
}
