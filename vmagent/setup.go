package vmagent

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// Limits and patterns for Setup's input, which comes from the host and is
// checked again here.
const (
	// maxShares bounds the virtiofs shares (each is a QEMU device).
	maxShares = 32
	// deviceWait bounds the wait for the disks and the NIC to appear: their
	// drivers were loaded at boot, but the nodes come asynchronously.
	deviceWait = 10 * time.Second
	devicePoll = 20 * time.Millisecond
	// maxSymlinks bounds the links followed when resolving a share target,
	// like the kernel's own limit.
	maxSymlinks = 40
	// netDevice is the guest's NIC: without udev the kernel names it eth0.
	netDevice = "eth0"
	// minEntropy and maxEntropy bound the host's randomness in Setup: 32
	// bytes are a full reseed of the CRNG; more is waste.
	minEntropy, maxEntropy = 32, 512
)

var (
	// A virtio-blk serial is at most 20 bytes (VIRTIO_BLK_ID_BYTES).
	serialPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$`)
	// A virtiofs tag is at most 36 bytes.
	tagPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,35}$`)
	// An RFC 1123 host name label.
	labelPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
)

// bannedTargets are where no share may land, even through a symlink in the
// image: the kernel's own filesystems (firecracker-containerd refuses the
// same).
var bannedTargets = []string{"/proc", "/sys", "/dev"}

// setupPaths are where Setup looks and works; tests point them elsewhere.
type setupPaths struct {
	sysBlock string // /sys/block
	virtiofs string // the virtiofs driver's directory: a link per device it drives
	dev      string // /dev
	work     string // the mount points of the disks and the new root
	etc      string // the account files of the root processes run in
}

var guestPaths = setupPaths{sysBlock: "/sys/block", virtiofs: "/sys/bus/virtio/drivers/virtiofs", dev: "/dev",
	work: "/run/agentconnect", etc: "/etc"}

// setupPlan is a validated SetupRequest.
type setupPlan struct {
	root, upper, docker string // disk serials; docker may be ""
	shares              []shareSpec
	network             *networkSpec
	settle              bool      // wait for the warm tools (warm)
	entropy             []byte    // the host's randomness
	now                 time.Time // the host's clock
}

type shareSpec struct {
	tag, target string
	readonly    bool
}

type networkSpec struct {
	address  netip.Prefix
	gateway  netip.Addr
	hostname string
}

// checkSetup validates a SetupRequest: each rule is a named check.
func checkSetup(req *vmagentv1.SetupRequest) (setupPlan, error) {
	var plan setupPlan
	var err error
	if plan.root, err = checkDisk("root", req.GetRoot(), true, false); err != nil {
		return plan, err
	}
	if plan.upper, err = checkDisk("upper", req.GetUpper(), true, true); err != nil {
		return plan, err
	}
	if plan.docker, err = checkDisk("docker", req.GetDocker(), false, true); err != nil {
		return plan, err
	}
	if plan.root == plan.upper || (plan.docker != "" && (plan.docker == plan.root || plan.docker == plan.upper)) {
		return plan, errdefs.InvalidArgument("setup: the root, upper and docker disks must have different serials")
	}
	plan.settle = req.GetSettle()
	if n := len(req.GetEntropy()); n < minEntropy || n > maxEntropy {
		return plan, errdefs.InvalidArgument("setup: %d bytes of entropy from the host, want %d to %d", n, minEntropy, maxEntropy)
	}
	if req.GetTimeUnixNano() <= 0 {
		return plan, errdefs.InvalidArgument("setup: no time from the host (time_unix_nano %d)", req.GetTimeUnixNano())
	}
	plan.entropy, plan.now = req.GetEntropy(), time.Unix(0, req.GetTimeUnixNano())
	if plan.shares, err = checkShares(req.GetShares()); err != nil {
		return plan, err
	}
	if req.GetNetwork() != nil {
		n, err := checkNetwork(req.GetNetwork())
		if err != nil {
			return plan, err
		}
		plan.network = &n
	}
	return plan, nil
}

// checkTrust validates a TrustRequest: one PEM certificate.
func checkTrust(req *vmagentv1.TrustRequest) (string, error) {
	ca := req.GetSessionCaPem()
	if block, _ := pem.Decode([]byte(ca)); block == nil || block.Type != "CERTIFICATE" || len(ca) > maxSessionCA {
		return "", errdefs.InvalidArgument("trust: the session CA is not one PEM certificate of at most %d bytes", maxSessionCA)
	}
	return ca, nil
}

// maxSessionCA bounds the session CA's PEM (one P-256 certificate is
// under 1 KiB).
const maxSessionCA = 16 << 10

// Where the guest finds its trust store: the image's system bundle, and
// the bundle with the session CA (session.CABundlePath), which the
// runtime's trust variables name.
const (
	systemCABundle  = "/etc/ssl/certs/ca-certificates.crt"
	sessionCABundle = "/run/agentconnect/ca-bundle.pem"
)

// trustSessionCA writes the system's certificates and the session CA's to
// sessionCABundle (on the guest's /run, gone at power-off) and binds that,
// read-only, over the system bundle, so that tools reading it trust the
// session CA for this boot only: the upper disk keeps the image's file.
func trustSessionCA(root, caPEM string) error {
	var system []byte
	resolved, err := resolveIn(root, systemCABundle)
	if err != nil {
		return err
	}
	if err := checkResolvedTarget(systemCABundle, resolved); err != nil {
		return err
	}
	sysPath := filepath.Join(root, resolved)
	fi, err := os.Lstat(sysPath)
	regular := err == nil && fi.Mode().IsRegular()
	if regular {
		if system, err = os.ReadFile(sysPath); err != nil {
			return err
		}
	}
	if err := replaceFile(root, sessionCABundle, string(system)+"\n"+caPEM); err != nil {
		return err
	}
	if !regular {
		return nil // an image without a system bundle: the variables name ours
	}
	bundle := filepath.Join(root, sessionCABundle)
	if err := unix.Mount(bundle, sysPath, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over %s: %w", sessionCABundle, resolved, err)
	}
	return unix.Mount("", sysPath, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
}

func checkDisk(role string, d *vmagentv1.Disk, required, writable bool) (string, error) {
	if d.GetSerial() == "" {
		if required {
			return "", errdefs.InvalidArgument("setup: no %s disk", role)
		}
		return "", nil
	}
	if !serialPattern.MatchString(d.GetSerial()) {
		return "", errdefs.InvalidArgument("setup: %s disk serial %q: want 1 to 20 letters, digits, '_', '.' or '-'", role, d.GetSerial())
	}
	if writable && d.GetReadonly() {
		return "", errdefs.InvalidArgument("setup: the %s disk must be writable", role)
	}
	return d.GetSerial(), nil
}

func checkShares(shares []*vmagentv1.Share) ([]shareSpec, error) {
	if len(shares) > maxShares {
		return nil, errdefs.InvalidArgument("setup: %d shares, at most %d", len(shares), maxShares)
	}
	tags, targets := map[string]bool{}, map[string]bool{}
	var out []shareSpec
	for _, s := range shares {
		if !tagPattern.MatchString(s.GetTag()) {
			return nil, errdefs.InvalidArgument("setup: share tag %q: want 1 to 36 letters, digits, '_', '.' or '-'", s.GetTag())
		}
		if err := checkTargetPath(s.GetTarget()); err != nil {
			return nil, errdefs.InvalidArgument("setup: share %s: %v", s.GetTag(), err)
		}
		if tags[s.GetTag()] {
			return nil, errdefs.InvalidArgument("setup: share tag %s given twice", s.GetTag())
		}
		if targets[s.GetTarget()] {
			return nil, errdefs.InvalidArgument("setup: share target %s given twice", s.GetTarget())
		}
		tags[s.GetTag()], targets[s.GetTarget()] = true, true
		out = append(out, shareSpec{tag: s.GetTag(), target: s.GetTarget(), readonly: s.GetReadonly()})
	}
	return out, nil
}

// checkTargetPath checks a share target as written; the resolved path is
// checked again when it is mounted.
func checkTargetPath(target string) error {
	switch {
	case !filepath.IsAbs(target):
		return fmt.Errorf("target %q is not an absolute path", target)
	case filepath.Clean(target) != target:
		return fmt.Errorf("target %q is not clean (want %q)", target, filepath.Clean(target))
	case strings.ContainsAny(target, "\x00\n,"):
		return fmt.Errorf("target %q contains a NUL, newline or comma", target)
	case len(target) > 1024:
		return fmt.Errorf("target is %d bytes long, at most 1024", len(target))
	}
	return checkResolvedTarget(target, target)
}

// checkResolvedTarget refuses a target that is, or resolves to, the root or
// a place under a banned directory.
func checkResolvedTarget(target, resolved string) error {
	if resolved == "/" {
		return fmt.Errorf("target %s resolves to /: a share cannot replace the root", target)
	}
	for _, b := range bannedTargets {
		if resolved == b || strings.HasPrefix(resolved, b+"/") {
			if resolved == target {
				return fmt.Errorf("target %s is inside %s", target, b)
			}
			return fmt.Errorf("target %s resolves to %s, inside %s", target, resolved, b)
		}
	}
	return nil
}

func checkNetwork(n *vmagentv1.Network) (networkSpec, error) {
	var spec networkSpec
	addr, err := netip.ParsePrefix(n.GetAddress())
	if err != nil || !addr.Addr().Is4() || addr.Bits() < 1 {
		return spec, errdefs.InvalidArgument("setup: network address %q: want an IPv4 address with its prefix length, like 192.168.127.2/24", n.GetAddress())
	}
	gw, err := netip.ParseAddr(n.GetGateway())
	if err != nil || !gw.Is4() {
		return spec, errdefs.InvalidArgument("setup: network gateway %q: want an IPv4 address", n.GetGateway())
	}
	if !addr.Contains(gw) || gw == addr.Addr() {
		return spec, errdefs.InvalidArgument("setup: network gateway %s is not another address of %s", gw, addr.Masked())
	}
	if h := n.GetHostname(); h != "" {
		if len(h) > 64 {
			return spec, errdefs.InvalidArgument("setup: hostname %q is longer than 64 bytes", h)
		}
		for _, label := range strings.Split(h, ".") {
			if !labelPattern.MatchString(label) {
				return spec, errdefs.InvalidArgument("setup: hostname %q: want dot-separated labels of letters, digits and inner '-'", h)
			}
		}
	}
	return networkSpec{address: addr, gateway: gw, hostname: n.GetHostname()}, nil
}

// runSetup builds the guest's root from plan and moves the agent into it.
// The agent stays PID 1; everything it starts afterwards runs there.
func runSetup(paths setupPaths, plan setupPlan, logf func(string, ...any)) error {
	start := time.Now()
	last, slow := start, []string{}
	step := func(name string, err error) error {
		if err != nil {
			return fmt.Errorf("setup: %s: %w", name, err)
		}
		// The console says where a slow setup spent its time.
		if d := time.Since(last); d >= 5*time.Millisecond {
			slow = append(slow, fmt.Sprintf("%s %v", name, d.Round(time.Millisecond)))
		}
		last = time.Now()
		return nil
	}
	// First, before anything reads the clock or a random number: a guest
	// restored from a snapshot has the snapshot's.
	if err := step("take the host's randomness and time", freshIdentity(plan.entropy, plan.now)); err != nil {
		return err
	}
	// The NIC's configuration touches nothing of the disks: it goes on
	// while the guest waits for them.
	var network chan error
	if n := plan.network; n != nil {
		network = make(chan error, 1)
		go func() { network <- configureNetwork(*n) }()
	}
	disks, err := findDisks(paths, []string{plan.root, plan.upper, plan.docker}, deviceWait)
	if err := step("find disks", err); err != nil {
		return err
	}
	// A restored guest probed the snapshot's disks when it booted: what it
	// cached of them is not this session's.
	if err := step("drop the disks' buffers", dropBuffers(disks)); err != nil {
		return err
	}
	lower := filepath.Join(paths.work, "lower")
	upper := filepath.Join(paths.work, "upper")
	root := filepath.Join(paths.work, "root")
	if err := step("mount the root disk", mountDisk(disks[plan.root], lower, unix.MS_RDONLY)); err != nil {
		return err
	}
	if err := step("mount the upper disk", mountDisk(disks[plan.upper], upper, 0)); err != nil {
		return err
	}
	if err := step("mount the overlay root", mountOverlay(lower, upper, root)); err != nil {
		return err
	}
	if err := step("give the VM its machine id", ensureMachineID(root)); err != nil {
		return err
	}
	if err := step("mount the system filesystems", mountAll(root, append(systemMounts[:len(systemMounts):len(systemMounts)], cgroupMount))); err != nil {
		return err
	}
	if plan.docker != "" {
		if err := step("mount the docker disk", mountInRoot(root, disks[plan.docker], "/var/lib/docker", "ext4", 0)); err != nil {
			return err
		}
	}
	// The host may plug the shares in after the guest booted (a restored
	// snapshot has none): their devices come asynchronously.
	if err := step("find the shares", waitShares(paths, len(plan.shares), deviceWait)); err != nil {
		return err
	}
	for _, s := range plan.shares {
		var flags uintptr = unix.MS_NOSUID | unix.MS_NODEV
		if s.readonly {
			flags |= unix.MS_RDONLY
		}
		if err := step("mount share "+s.tag, mountInRoot(root, s.tag, s.target, "virtiofs", flags)); err != nil {
			return err
		}
		if err := step("open the way to share "+s.tag, searchable(root, s.target)); err != nil {
			return err
		}
	}
	if n := plan.network; n != nil {
		if err := step("configure "+netDevice, <-network); err != nil {
			return err
		}
		files := map[string]string{"/etc/resolv.conf": "nameserver " + n.gateway.String() + "\n"}
		if n.hostname != "" {
			files["/etc/hostname"] = n.hostname + "\n"
			files["/etc/hosts"] = hostsFile(n.hostname)
			if err := step("set the hostname", unix.Sethostname([]byte(n.hostname))); err != nil {
				return err
			}
		}
		for name, content := range files {
			if err := step("write "+name, replaceFile(root, name, content)); err != nil {
				return err
			}
		}
	}
	if err := step("switch root", switchRoot(root)); err != nil {
		return err
	}
	if plan.docker != "" {
		startDocker(logf)
	}
	step("start docker's socket", nil)
	warm(logf, plan.settle)
	step("warm", nil)
	logf("setup done in %v (%s)", time.Since(start).Round(time.Millisecond), strings.Join(slow, ", "))
	return nil
}

// freshIdentity credits entropy to the kernel's pool, reseeds its CRNG from
// it, and sets the wall clock to now.
func freshIdentity(entropy []byte, now time.Time) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info: entropy_count (bits), buf_size (bytes), buf.
	info := make([]byte, 8+len(entropy))
	binary.NativeEndian.PutUint32(info[0:], uint32(8*len(entropy)))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(entropy)))
	copy(info[8:], entropy)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", errno)
	}
	ts := unix.NsecToTimespec(now.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set the clock: %w", err)
	}
	return nil
}

// ensureMachineID writes a random /etc/machine-id into root when it has
// none (or an empty one, as container images ship it): every VM is its own
// machine, restored from a snapshot or not, and keeps its id on its upper
// disk across stop and resume. Called after the pool was reseeded.
func ensureMachineID(root string) error {
	const name = "/etc/machine-id"
	resolved, err := resolveIn(root, name)
	if err != nil {
		return err
	}
	if b, err := os.ReadFile(filepath.Join(root, resolved)); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return nil
	}
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	return replaceFile(root, name, hex.EncodeToString(id)+"\n")
}

// dropBuffers drops the kernel's cached blocks of each disk (BLKFLSBUF).
func dropBuffers(disks map[string]string) error {
	for _, dev := range disks {
		f, err := os.Open(dev)
		if err != nil {
			return err
		}
		err = unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0)
		f.Close()
		if err != nil {
			return fmt.Errorf("BLKFLSBUF %s: %w", dev, err)
		}
	}
	return nil
}

// waitShares waits, at most wait, until the virtiofs driver drives n
// devices.
func waitShares(paths setupPaths, n int, wait time.Duration) error {
	found := 0
	if pollUntil(wait, func() bool {
		entries, _ := os.ReadDir(paths.virtiofs)
		found = 0
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "virtio") {
				found++
			}
		}
		return found >= n
	}) {
		return nil
	}
	return fmt.Errorf("%d of %d virtiofs devices in %s after %v (is each attached with vhost-user-fs-pci?)",
		found, n, paths.virtiofs, wait)
}

// pollUntil calls ready every devicePoll until it reports true, for at most
// wait, and reports whether it did: the guest's devices come asynchronously.
// ready runs at least once.
func pollUntil(wait time.Duration, ready func() bool) bool {
	deadline := time.Now().Add(wait)
	for !ready() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(devicePoll)
	}
	return true
}

// findDisks waits, at most wait, for a virtio disk with each serial
// ("" is skipped), and returns their device paths by serial.
func findDisks(paths setupPaths, serials []string, wait time.Duration) (map[string]string, error) {
	var found map[string]string
	var missing []string
	if pollUntil(wait, func() bool {
		found, missing = scanDisks(paths, serials)
		return len(missing) == 0
	}) {
		return found, nil
	}
	return nil, fmt.Errorf("no disk with serial %s in %s after %v (is it attached with -drive ...,serial=NAME?)",
		strings.Join(missing, ", "), paths.sysBlock, wait)
}

func scanDisks(paths setupPaths, serials []string) (map[string]string, []string) {
	bySerial := map[string]string{}
	entries, _ := os.ReadDir(paths.sysBlock)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(paths.sysBlock, e.Name(), "serial"))
		if err != nil {
			continue
		}
		dev := filepath.Join(paths.dev, e.Name())
		if _, err := os.Stat(dev); err == nil {
			bySerial[strings.TrimSpace(string(b))] = dev
		}
	}
	found := map[string]string{}
	var missing []string
	for _, s := range serials {
		if s == "" {
			continue
		}
		if dev, ok := bySerial[s]; ok {
			found[s] = dev
		} else {
			missing = append(missing, s)
		}
	}
	return found, missing
}

func mountDisk(dev, target string, flags uintptr) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, target, "ext4", flags, ""); err != nil {
		return fmt.Errorf("mount %s (ext4) on %s: %w", dev, target, err)
	}
	return nil
}

// mountOverlay makes root an overlay of lower under a directory pair on the
// upper disk, kept there across boots of the session.
func mountOverlay(lower, upperDisk, root string) error {
	upper := filepath.Join(upperDisk, "upper")
	work := filepath.Join(upperDisk, "work")
	for _, d := range []string{upper, work, root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay on %s (%s): %w", root, opts, err)
	}
	return nil
}

// mountInRoot mounts source on target inside root, resolving target's
// symlinks inside root and refusing a place under a banned directory.
func mountInRoot(root, source, target, fstype string, flags uintptr) error {
	resolved, err := resolveIn(root, target)
	if err != nil {
		return err
	}
	if err := checkResolvedTarget(target, resolved); err != nil {
		return err
	}
	dir := filepath.Join(root, resolved)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(source, dir, fstype, flags, ""); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", source, fstype, resolved, err)
	}
	return nil
}

// searchable lets every user through the directories above target in root
// (the image's /root is 0700, and a root daemon's home is beneath it), so
// that the runtime user reaches its shares: the search bit only, nothing
// becomes readable, and only on the root's own file system (a share above
// another is the host's, and stays as the host has it).
func searchable(root, target string) error {
	resolved, err := resolveIn(root, target)
	if err != nil {
		return err
	}
	var rootSt unix.Stat_t
	if err := unix.Stat(root, &rootSt); err != nil {
		return err
	}
	for d := filepath.Dir(resolved); d != "/"; d = filepath.Dir(d) {
		p := filepath.Join(root, d)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Dev == rootSt.Dev && st.Mode&unix.S_IFMT == unix.S_IFDIR && st.Mode&0o001 == 0 {
			if err := unix.Chmod(p, st.Mode&0o7777|0o001); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveIn resolves path as if root were "/": symlinks are followed
// (absolute ones from root), ".." stops at root, and the components that do
// not exist yet are kept as written. It returns an absolute path relative
// to root.
func resolveIn(root, path string) (string, error) {
	resolved := "/"
	pending := strings.Split(path, "/")
	links := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			resolved = filepath.Dir(resolved)
			continue
		}
		next := filepath.Join(resolved, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if errors.Is(err, fs.ErrNotExist) {
			resolved = next
			continue
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > maxSymlinks {
			return "", fmt.Errorf("resolve %s: %w", path, unix.ELOOP)
		}
		dest, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(dest) {
			resolved = "/"
		}
		pending = append(strings.Split(dest, "/"), pending...)
	}
	return resolved, nil
}

// replaceFile writes name (absolute, inside root) as a regular file with
// content, replacing a symlink there instead of following it: an image's
// /etc/resolv.conf often links to a resolver that does not run here.
func replaceFile(root, name, content string) error {
	dir, err := resolveIn(root, filepath.Dir(name))
	if err != nil {
		return err
	}
	if err := checkResolvedTarget(filepath.Dir(name), dir); err != nil {
		return err
	}
	dir = filepath.Join(root, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, filepath.Base(name))
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func hostsFile(hostname string) string {
	short, _, _ := strings.Cut(hostname, ".")
	names := hostname
	if short != hostname {
		names += " " + short
	}
	return "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + names + "\n"
}

// configureNetwork brings the NIC up with its address and default route.
func configureNetwork(n networkSpec) error {
	if !pollUntil(deviceWait, func() bool { _, err := net.InterfaceByName(netDevice); return err == nil }) {
		return fmt.Errorf("no %s after %v (is a virtio-net device attached?)", netDevice, deviceWait)
	}
	if err := linkUp(netDevice); err != nil {
		return err
	}
	if err := addAddress(netDevice, n.address); err != nil {
		return err
	}
	return addDefaultRoute(netDevice, n.gateway)
}

// switchRoot makes root the agent's "/", as switch_root does from an
// initramfs (where pivot_root is not allowed): move the mount over "/",
// then chroot into it. The mounts under root move with it.
func switchRoot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s to /: %w", root, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}
