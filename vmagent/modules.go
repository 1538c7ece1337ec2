package vmagent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The drivers the agent loads at boot, each after its dependencies. A
// module the kernel has built in, or that is missing, is skipped: the device
// it drives is what matters, and its absence is reported where the device is
// needed.
var (
	// serialModules come first: the virtio buses (PCI for q35, MMIO for
	// microvm) and the serial port the host talks to.
	serialModules = []string{"virtio_pci", "virtio_mmio", "virtio_console"}
	// vsockModules replace virtio_console when the transport is vsock.
	vsockModules = []string{"virtio_pci", "virtio_mmio", "vsock", "vmw_vsock_virtio_transport"}
	// setupModules are loaded while the agent already serves: Setup waits
	// for them (disks, the NIC, virtiofs, overlayfs, an entropy source, and
	// the balloon, which reports free pages so that the host takes them
	// back).
	setupModules = []string{
		"virtio_blk", "virtio_net", "virtio_rng", "virtio_balloon",
		"virtio_console", "vsock", "vmw_vsock_virtio_transport",
		"fuse", "virtiofs", "overlay",
	}
)

// moduleIndex is what modules.dep and modules.builtin say about a kernel.
type moduleIndex struct {
	path    map[string]string   // module name → file, relative to the modules dir
	deps    map[string][]string // module name → its dependencies' names, as listed
	builtin map[string]bool
	loaded  map[string]bool // by loadModules: skipped by later calls
}

// moduleName is the name of the module in file: "kernel/a/crc32c-intel.ko.xz"
// is crc32c_intel (the kernel treats '-' and '_' alike).
func moduleName(file string) string {
	base := filepath.Base(file)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

// parseModulesDep reads modules.dep: "path.ko: dep.ko dep.ko" per line.
func parseModulesDep(r io.Reader) (*moduleIndex, error) {
	ix := &moduleIndex{path: map[string]string{}, deps: map[string][]string{}, builtin: map[string]bool{}, loaded: map[string]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		file, deps, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep: no ':' in %q", line)
		}
		name := moduleName(file)
		ix.path[name] = file
		for _, d := range strings.Fields(deps) {
			ix.deps[name] = append(ix.deps[name], moduleName(d))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("modules.dep: %w", err)
	}
	return ix, nil
}

// addBuiltin reads modules.builtin: one path per line.
func (ix *moduleIndex) addBuiltin(r io.Reader) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			ix.builtin[moduleName(line)] = true
		}
	}
	return sc.Err()
}

// loadOrder returns the files to load for names, each after its
// dependencies, every file once and none loaded already; and the names that
// are neither loadable nor built in.
func (ix *moduleIndex) loadOrder(names []string) (files, missing []string) {
	seen := map[string]bool{}
	for name := range ix.loaded {
		seen[name] = true
	}
	var visit func(name string, depth int)
	visit = func(name string, depth int) {
		if seen[name] || depth > 64 { // a dependency cycle would be a broken modules.dep
			return
		}
		seen[name] = true
		file, ok := ix.path[name]
		if !ok {
			if !ix.builtin[name] {
				missing = append(missing, name)
			}
			return
		}
		// modules.dep lists a module's dependencies so that the last is
		// loaded first, as modprobe does; each one's own come before it.
		deps := ix.deps[name]
		for i := len(deps) - 1; i >= 0; i-- {
			visit(deps[i], depth+1)
		}
		files = append(files, file)
	}
	for _, n := range names {
		visit(strings.ReplaceAll(n, "-", "_"), 0)
	}
	return files, missing
}

// readModuleIndex reads modules.dep and modules.builtin in dir
// (/lib/modules/RELEASE).
func readModuleIndex(dir string) (*moduleIndex, error) {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("load modules: %w", err)
	}
	ix, err := parseModulesDep(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("load modules: %w", err)
	}
	if b, err := os.Open(filepath.Join(dir, "modules.builtin")); err == nil {
		ix.addBuiltin(b)
		b.Close()
	}
	return ix, nil
}

// loadModules loads names and their dependencies from dir with
// finit_module, and logs one line. Calls must not overlap.
func (ix *moduleIndex) loadModules(dir string, names []string, logf func(string, ...any)) {
	start := time.Now()
	files, missing := ix.loadOrder(names)
	loaded := 0
	for _, file := range files {
		err := loadModule(filepath.Join(dir, file))
		ix.loaded[moduleName(file)] = true // or failed: no use trying again
		switch {
		case err == nil:
			loaded++
		case errors.Is(err, unix.EEXIST):
		default:
			logf("load module %s: %v", moduleName(file), err)
		}
	}
	if len(missing) > 0 {
		logf("modules not in %s (the devices they drive will be missing): %s", dir, strings.Join(missing, " "))
	}
	logf("loaded %d modules in %v", loaded, time.Since(start).Round(time.Millisecond))
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	if !strings.HasSuffix(path, ".ko") {
		flags = unix.MODULE_INIT_COMPRESSED_FILE // .ko.xz, .ko.zst: the kernel decompresses
	}
	return unix.FinitModule(int(f.Fd()), "", flags)
}
