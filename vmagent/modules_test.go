package vmagent

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

func loadTestIndex(t *testing.T) *moduleIndex {
	t.Helper()
	f, err := os.Open("testdata/modules.dep")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ix, err := parseModulesDep(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.Open("testdata/modules.builtin")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := ix.addBuiltin(b); err != nil {
		t.Fatal(err)
	}
	return ix
}

func TestModuleLoadOrder(t *testing.T) {
	ix := loadTestIndex(t)
	files, missing := ix.loadOrder(append(serialModules, setupModules...))
	var got []string
	for _, f := range files {
		got = append(got, moduleName(f))
	}
	want := []string{
		"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
		"virtio_mmio", "virtio_console", "virtio_blk",
		"failover", "net_failover", "virtio_net", "virtio_rng", "virtio_balloon",
		"vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport",
		"fuse", "virtiofs", "overlay",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("load order =\n%q\nwant\n%q", got, want)
	}
	if len(missing) != 0 {
		t.Errorf("missing = %q, want none", missing)
	}
}

func TestModuleLoadOrderSkipsLoaded(t *testing.T) {
	ix := loadTestIndex(t)
	for _, name := range []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci", "virtio_console"} {
		ix.loaded[name] = true
	}
	files, _ := ix.loadOrder([]string{"virtio_console", "virtio_blk", "virtiofs"})
	want := []string{"kernel/drivers/block/virtio_blk.ko", "kernel/fs/fuse/fuse.ko", "kernel/fs/fuse/virtiofs.ko"}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("load order after the transport's modules = %q, want %q", files, want)
	}
}

func TestModuleLoadOrderPutsDependenciesFirst(t *testing.T) {
	ix := loadTestIndex(t)
	var all []string
	for name := range ix.path {
		all = append(all, name)
	}
	files, _ := ix.loadOrder(all)
	pos := map[string]int{}
	for i, f := range files {
		name := moduleName(f)
		if _, dup := pos[name]; dup {
			t.Errorf("%s is loaded twice", name)
		}
		pos[name] = i
	}
	for name, deps := range ix.deps {
		for _, d := range deps {
			if pos[d] >= pos[name] {
				t.Errorf("%s (at %d) is loaded before its dependency %s (at %d)", name, pos[name], d, pos[d])
			}
		}
	}
}

func TestModuleLoadOrderBuiltinAndMissing(t *testing.T) {
	ix := loadTestIndex(t)
	files, missing := ix.loadOrder([]string{"ext4", "crc32c-generic", "no_such_module", "compressed-mod", "fuse"})
	want := []string{"kernel/fs/fuse/fuse.ko", "kernel/lib/example/compressed-mod.ko.xz"}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("files = %q, want %q", files, want)
	}
	if !reflect.DeepEqual(missing, []string{"no_such_module"}) {
		t.Errorf("missing = %q, want [no_such_module] (built-in modules are not missing)", missing)
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"kernel/arch/x86/crypto/crc32c-intel.ko":          "crc32c_intel",
		"virtio_pci.ko.xz":                                "virtio_pci",
		"kernel/fs/ext4/ext4.ko":                          "ext4",
		"kernel/drivers/char/hw_random/virtio-rng.ko.zst": "virtio_rng",
	} {
		if got := moduleName(in); got != want {
			t.Errorf("moduleName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseModulesDepRejectsGarbage(t *testing.T) {
	if _, err := parseModulesDep(strings.NewReader("kernel/a.ko: kernel/b.ko\nnot a dep line\n")); err == nil {
		t.Error("parseModulesDep accepted a line without ':'")
	}
}
