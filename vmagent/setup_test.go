package vmagent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

func validSetup() *vmagentv1.SetupRequest {
	return &vmagentv1.SetupRequest{
		Root:   &vmagentv1.Disk{Serial: "root", Readonly: true},
		Upper:  &vmagentv1.Disk{Serial: "upper"},
		Docker: &vmagentv1.Disk{Serial: "docker"},
		Shares: []*vmagentv1.Share{
			{Tag: "work", Target: "/work"},
			{Tag: "ro-data", Target: "/home/agent/.config/x", Readonly: true},
		},
		Network:      &vmagentv1.Network{Address: "192.168.127.2/24", Gateway: "192.168.127.1", Hostname: "session-1.agentconnect"},
		Entropy:      make([]byte, minEntropy),
		TimeUnixNano: time.Now().UnixNano(),
	}
}

func TestCheckSetupAcceptsValid(t *testing.T) {
	plan, err := checkSetup(validSetup())
	if err != nil {
		t.Fatal(err)
	}
	if plan.root != "root" || plan.upper != "upper" || plan.docker != "docker" || len(plan.shares) != 2 || plan.network == nil {
		t.Errorf("plan = %+v", plan)
	}
	minimal := &vmagentv1.SetupRequest{Root: &vmagentv1.Disk{Serial: "r"}, Upper: &vmagentv1.Disk{Serial: "u"},
		Entropy: make([]byte, maxEntropy), TimeUnixNano: 1}
	if plan, err := checkSetup(minimal); err != nil || plan.docker != "" || plan.network != nil {
		t.Errorf("checkSetup(root and upper only) = %+v, %v; want no docker disk, no network", plan, err)
	}
}

func TestCheckSetupRefuses(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*vmagentv1.SetupRequest)
		want   string
	}{
		{"no root disk", func(r *vmagentv1.SetupRequest) { r.Root = nil }, "no root disk"},
		{"no upper disk", func(r *vmagentv1.SetupRequest) { r.Upper = &vmagentv1.Disk{} }, "no upper disk"},
		{"serial with a slash", func(r *vmagentv1.SetupRequest) { r.Root.Serial = "../vda" }, "serial"},
		{"serial too long", func(r *vmagentv1.SetupRequest) { r.Upper.Serial = strings.Repeat("u", 21) }, "serial"},
		{"read-only upper", func(r *vmagentv1.SetupRequest) { r.Upper.Readonly = true }, "must be writable"},
		{"read-only docker", func(r *vmagentv1.SetupRequest) { r.Docker.Readonly = true }, "must be writable"},
		{"same serial twice", func(r *vmagentv1.SetupRequest) { r.Docker.Serial = "upper" }, "different serials"},
		{"share tag with a space", func(r *vmagentv1.SetupRequest) { r.Shares[0].Tag = "a b" }, "share tag"},
		{"share tag too long", func(r *vmagentv1.SetupRequest) { r.Shares[0].Tag = strings.Repeat("t", 37) }, "share tag"},
		{"relative target", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "work" }, "not an absolute path"},
		{"unclean target", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "/work/../proc" }, "not clean"},
		{"target in /proc", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "/proc/sys" }, "inside /proc"},
		{"target /sys", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "/sys" }, "inside /sys"},
		{"target in /dev", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "/dev/shm/x" }, "inside /dev"},
		{"target /", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "/" }, "cannot replace the root"},
		{"target with a comma", func(r *vmagentv1.SetupRequest) { r.Shares[0].Target = "/a,b" }, "comma"},
		{"same tag twice", func(r *vmagentv1.SetupRequest) { r.Shares[1].Tag = "work" }, "given twice"},
		{"same target twice", func(r *vmagentv1.SetupRequest) { r.Shares[1].Target = "/work" }, "given twice"},
		{"too many shares", func(r *vmagentv1.SetupRequest) {
			for i := range maxShares {
				r.Shares = append(r.Shares, &vmagentv1.Share{Tag: "t" + strings.Repeat("x", i), Target: "/s/" + strings.Repeat("x", i+1)})
			}
		}, "at most"},
		{"address without prefix", func(r *vmagentv1.SetupRequest) { r.Network.Address = "192.168.127.2" }, "network address"},
		{"IPv6 address", func(r *vmagentv1.SetupRequest) { r.Network.Address = "fd00::2/64" }, "network address"},
		{"gateway outside", func(r *vmagentv1.SetupRequest) { r.Network.Gateway = "10.0.0.1" }, "not another address"},
		{"gateway is the address", func(r *vmagentv1.SetupRequest) { r.Network.Gateway = "192.168.127.2" }, "not another address"},
		{"gateway not an address", func(r *vmagentv1.SetupRequest) { r.Network.Gateway = "gw" }, "network gateway"},
		{"hostname with underscore", func(r *vmagentv1.SetupRequest) { r.Network.Hostname = "a_b" }, "hostname"},
		{"hostname with a trailing dash", func(r *vmagentv1.SetupRequest) { r.Network.Hostname = "a-.b" }, "hostname"},
		{"no entropy", func(r *vmagentv1.SetupRequest) { r.Entropy = nil }, "0 bytes of entropy"},
		{"too little entropy", func(r *vmagentv1.SetupRequest) { r.Entropy = make([]byte, minEntropy-1) }, "want 32 to 512"},
		{"too much entropy", func(r *vmagentv1.SetupRequest) { r.Entropy = make([]byte, maxEntropy+1) }, "want 32 to 512"},
		{"no time", func(r *vmagentv1.SetupRequest) { r.TimeUnixNano = 0 }, "no time from the host"},
		{"time before 1970", func(r *vmagentv1.SetupRequest) { r.TimeUnixNano = -1 }, "no time from the host"},
		{"hostname too long", func(r *vmagentv1.SetupRequest) { r.Network.Hostname = strings.Repeat("a.", 33) + "a" }, "longer than 64"},
	}
	for _, tt := range tests {
		req := validSetup()
		tt.modify(req)
		_, err := checkSetup(req)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: checkSetup = %v, want an invalid-argument error containing %q", tt.name, err, tt.want)
		}
	}
}

// imageRoot makes a directory tree standing for an image's root, with
// symlinks an image could hold.
func imageRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"home/agent", "proc", "etc", "var/lib"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	links := map[string]string{
		"work":              "/proc/self",      // absolute: resolved inside the root
		"home/agent/escape": "../../../../sys", // ".." stops at the root
		"data":              "home/agent",      // relative, harmless
		"loop":              "loop",
		"etc/resolv.conf":   "/run/systemd/resolve/stub-resolv.conf",
		"etc/hostname":      "/proc/sys/kernel/hostname",
		"devices":           "/dev",
	}
	for name, dest := range links {
		if err := os.Symlink(dest, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestResolveIn(t *testing.T) {
	root := imageRoot(t)
	tests := []struct{ path, want string }{
		{"/work", "/proc/self"},
		{"/work/x", "/proc/self/x"},
		{"/home/agent/escape/fs", "/sys/fs"},
		{"/data/project", "/home/agent/project"},
		{"/new/dir", "/new/dir"},
		{"/../../etc", "/etc"},
		{"/etc/resolv.conf", "/run/systemd/resolve/stub-resolv.conf"},
	}
	for _, tt := range tests {
		got, err := resolveIn(root, tt.path)
		if err != nil || got != tt.want {
			t.Errorf("resolveIn(%q) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
	if _, err := resolveIn(root, "/loop/x"); err == nil {
		t.Error("resolveIn followed a symlink loop without end")
	}
}

func TestMountInRootRefusesSymlinksToBannedDirs(t *testing.T) {
	root := imageRoot(t)
	for _, target := range []string{"/work", "/home/agent/escape", "/devices/sda"} {
		err := mountInRoot(root, "tag", target, "virtiofs", 0)
		if err == nil || !strings.Contains(err.Error(), "resolves to") {
			t.Errorf("mountInRoot(%s) = %v, want a refusal naming where it resolves", target, err)
		}
	}
	// Nothing was created through the links.
	if _, err := os.Stat(filepath.Join(root, "proc", "self")); err == nil {
		t.Error("mountInRoot created a directory under the image's /proc")
	}
}

func TestReplaceFileReplacesSymlinks(t *testing.T) {
	root := imageRoot(t)
	outside := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(outside, []byte("keep"), 0o644)
	os.Symlink(outside, filepath.Join(root, "etc", "hosts"))
	for _, name := range []string{"/etc/resolv.conf", "/etc/hostname", "/etc/hosts", "/etc/new"} {
		if err := replaceFile(root, name, "content\n"); err != nil {
			t.Fatalf("replaceFile(%s) = %v", name, err)
		}
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s after replaceFile: %v, %v; want a regular file", name, fi, err)
		}
		if b, _ := os.ReadFile(filepath.Join(root, name)); string(b) != "content\n" {
			t.Errorf("%s = %q, want %q", name, b, "content\n")
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "keep" {
		t.Errorf("a file outside the root was written through a symlink: %q", b)
	}
	os.Symlink("/proc", filepath.Join(root, "etc2"))
	if err := replaceFile(root, "/etc2/x", "x"); err == nil {
		t.Error("replaceFile wrote under a directory that resolves into /proc")
	}
}

// fakeBlock makes /sys/block and /dev with virtio disks by serial.
func fakeBlock(t *testing.T, disks map[string]string) setupPaths {
	t.Helper()
	root := t.TempDir()
	p := setupPaths{sysBlock: filepath.Join(root, "sys", "block"), dev: filepath.Join(root, "dev"), work: filepath.Join(root, "run")}
	os.MkdirAll(p.dev, 0o755)
	os.MkdirAll(filepath.Join(p.sysBlock, "loop0"), 0o755) // a device with no serial
	for dev, serial := range disks {
		os.MkdirAll(filepath.Join(p.sysBlock, dev), 0o755)
		os.WriteFile(filepath.Join(p.sysBlock, dev, "serial"), []byte(serial+"\n"), 0o444)
		os.WriteFile(filepath.Join(p.dev, dev), nil, 0o600)
	}
	return p
}

func TestFindDisks(t *testing.T) {
	p := fakeBlock(t, map[string]string{"vda": "root", "vdb": "upper", "vdc": "docker"})
	got, err := findDisks(p, []string{"root", "upper", ""}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got["root"] != filepath.Join(p.dev, "vda") || got["upper"] != filepath.Join(p.dev, "vdb") || len(got) != 2 {
		t.Errorf("findDisks = %v", got)
	}
	start := time.Now()
	_, err = findDisks(p, []string{"root", "absent"}, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("findDisks of a missing disk = %v, want an error naming it", err)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Error("findDisks did not wait for the disk to appear")
	}
}

func TestFindDisksWaitsForLateNodes(t *testing.T) {
	p := fakeBlock(t, map[string]string{"vda": "root"})
	os.Remove(filepath.Join(p.dev, "vda")) // sysfs knows it, devtmpfs not yet
	go func() {
		time.Sleep(100 * time.Millisecond)
		os.WriteFile(filepath.Join(p.dev, "vda"), nil, 0o600)
	}()
	if got, err := findDisks(p, []string{"root"}, 5*time.Second); err != nil || got["root"] == "" {
		t.Errorf("findDisks = %v, %v; want the disk once its node appears", got, err)
	}
}

// TestTrustSessionCA: the bundle holds the image's certificates and the
// session CA's, and is what the system bundle's path reads, for this boot
// only: the file beneath is the image's. Needs root (a bind mount).
func TestTrustSessionCA(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: binds the bundle over the system's")
	}
	root := t.TempDir()
	sys := filepath.Join(root, systemCABundle)
	if err := os.MkdirAll(filepath.Dir(sys), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sys, []byte("SYSTEM\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
	if err := trustSessionCA(root, ca); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(sys, unix.MNT_DETACH)
	for _, p := range []string{sys, filepath.Join(root, sessionCABundle)} {
		if got, _ := os.ReadFile(p); string(got) != "SYSTEM\n\n"+ca {
			t.Errorf("%s holds %q", p, got)
		}
	}
	if err := os.WriteFile(sys, []byte("x"), 0o644); err == nil {
		t.Error("the bound bundle is writable")
	}
	unix.Unmount(sys, unix.MNT_DETACH)
	if got, _ := os.ReadFile(sys); string(got) != "SYSTEM\n" {
		t.Errorf("the image's bundle beneath holds %q", got)
	}
	if sessionCABundle != session.CABundlePath {
		t.Errorf("the guest's bundle %s is not where the runtime's variables point (%s)", sessionCABundle, session.CABundlePath)
	}
}

func TestSearchableOpensTheWayOnly(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "root/.agentconnect/agents/a"), 0o700)
	os.Chmod(filepath.Join(root, "root"), 0o700)
	os.Chmod(filepath.Join(root, "root/.agentconnect"), 0o750)
	if err := searchable(root, "/root/.agentconnect/agents/a/home"); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"root": 0o701, "root/.agentconnect": 0o751, "root/.agentconnect/agents": 0o701, "root/.agentconnect/agents/a": 0o701} {
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, %v; want %v", p, fi.Mode().Perm(), err, want)
		}
	}
}

func TestWaitSharesCountsTheDriversDevices(t *testing.T) {
	dir := t.TempDir()
	paths := setupPaths{virtiofs: dir}
	for _, name := range []string{"virtio3", "bind", "uevent"} {
		os.WriteFile(filepath.Join(dir, name), nil, 0o644)
	}
	if err := waitShares(paths, 1, 0); err != nil {
		t.Errorf("one device, one share: %v", err)
	}
	err := waitShares(paths, 2, 3*devicePoll)
	if err == nil || !strings.Contains(err.Error(), "1 of 2 virtiofs devices") {
		t.Errorf("one device, two shares: %v, want 1 of 2 found", err)
	}
	go func() {
		time.Sleep(devicePoll)
		os.WriteFile(filepath.Join(dir, "virtio7"), nil, 0o644)
	}()
	if err := waitShares(paths, 2, 10*time.Second); err != nil {
		t.Errorf("a device plugged while waiting: %v", err)
	}
	if err := waitShares(setupPaths{virtiofs: filepath.Join(dir, "missing")}, 0, 0); err != nil {
		t.Errorf("no shares, no driver loaded: %v", err)
	}
}

// TestEnsureMachineID: an image with no machine id, or an empty one, gets a
// random one; one that has an id keeps it; two VMs never share one.
func TestEnsureMachineID(t *testing.T) {
	read := func(root string) string {
		b, _ := os.ReadFile(filepath.Join(root, "etc/machine-id"))
		return string(b)
	}
	a, b := imageRoot(t), imageRoot(t)
	for _, root := range []string{a, b} {
		if err := ensureMachineID(root); err != nil {
			t.Fatal(err)
		}
	}
	if id := read(a); len(id) != 33 || !strings.HasSuffix(id, "\n") || id == read(b) {
		t.Errorf("machine ids %q and %q: want two different 32-hex-digit lines", id, read(b))
	}
	kept := read(a)
	if err := ensureMachineID(a); err != nil || read(a) != kept {
		t.Errorf("an existing id was replaced: %q -> %q, %v", kept, read(a), err)
	}
	empty := imageRoot(t)
	os.WriteFile(filepath.Join(empty, "etc/machine-id"), nil, 0o444)
	if err := ensureMachineID(empty); err != nil || len(read(empty)) != 33 {
		t.Errorf("an empty machine-id stayed empty: %q, %v", read(empty), err)
	}
}
