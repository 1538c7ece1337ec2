package vmagent

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// These tests boot the agent for real: QEMU under TCG, the Debian cloud
// kernel, an initramfs holding the agent as /init, busybox and the modules.
// They skip, saying why, where QEMU or the kernel cannot be had. The kernel
// is cached in bin/vmtest/ (gitignored); the first run fetches it with
// apt-get download (linux-image-cloud-amd64, then the versioned package it
// depends on), unpacks it and runs depmod.

const (
	qemuBinary = "qemu-system-x86_64"
	busybox    = "/bin/busybox"
	// bootTimeout bounds the boot under TCG (about 2.4 s when idle; a
	// loaded CI machine is slower).
	bootTimeout = 60 * time.Second
)

// vmKernel is an unpacked kernel package: vmlinuz and its modules.
type vmKernel struct {
	release string
	vmlinuz string
	modules string // lib/modules/RELEASE
}

// cacheDir is bin/vmtest at the top of the repository.
func cacheDir(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(wd), "bin", "vmtest")
}

// needKernel finds the cached cloud kernel, or fetches and unpacks it.
func needKernel(t *testing.T) vmKernel {
	t.Helper()
	if _, err := exec.LookPath(qemuBinary); err != nil {
		t.Skipf("%s is not installed (apt-get install qemu-system-x86)", qemuBinary)
	}
	if _, err := os.Stat(busybox); err != nil {
		t.Skipf("%s is missing (apt-get install busybox-static)", busybox)
	}
	dir := filepath.Join(cacheDir(t), "kernel")
	if k, ok := findKernel(dir); ok {
		return k
	}
	if err := fetchKernel(t, dir); err != nil {
		t.Skipf("no guest kernel in %s, and fetching it failed: %v", dir, err)
	}
	k, ok := findKernel(dir)
	if !ok {
		t.Skipf("no guest kernel in %s after fetching it", dir)
	}
	return k
}

func findKernel(dir string) (vmKernel, bool) {
	matches, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*-cloud-amd64"))
	for _, vmlinuz := range matches {
		release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
		modules := filepath.Join(dir, "lib", "modules", release)
		if _, err := os.Stat(filepath.Join(modules, "modules.dep")); err == nil {
			return vmKernel{release: release, vmlinuz: vmlinuz, modules: modules}, true
		}
	}
	return vmKernel{}, false
}

// fetchKernel downloads linux-image-cloud-amd64, then the versioned package
// it depends on, unpacks it into dir and runs depmod (the .deb ships no
// modules.dep).
func fetchKernel(t *testing.T, dir string) error {
	for _, tool := range []string{"apt-get", "dpkg-deb", "dpkg", "depmod"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed", tool)
		}
	}
	debs := filepath.Join(filepath.Dir(dir), "deb")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	run := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = debs
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	t.Logf("fetching the guest kernel into %s", dir)
	if _, err := run("apt-get", "download", "linux-image-cloud-amd64"); err != nil {
		return err
	}
	meta, _ := filepath.Glob(filepath.Join(debs, "linux-image-cloud-amd64_*.deb"))
	if len(meta) == 0 {
		return fmt.Errorf("apt-get download left no linux-image-cloud-amd64 package")
	}
	depends, err := run("dpkg-deb", "-f", meta[len(meta)-1], "Depends")
	if err != nil {
		return err
	}
	pkg, _, _ := strings.Cut(strings.TrimSpace(depends), " ")
	if !strings.HasPrefix(pkg, "linux-image-") {
		return fmt.Errorf("linux-image-cloud-amd64 depends on %q, not a kernel image", depends)
	}
	if _, err := run("apt-get", "download", pkg); err != nil {
		return err
	}
	image, _ := filepath.Glob(filepath.Join(debs, pkg+"_*.deb"))
	if len(image) == 0 {
		return fmt.Errorf("apt-get download left no %s package", pkg)
	}
	if _, err := run("dpkg", "-x", image[0], dir); err != nil {
		return err
	}
	release := strings.TrimPrefix(pkg, "linux-image-")
	_, err = run("depmod", "-b", dir, release)
	return err
}

// buildAgent builds the agent as the boot would use it: static.
func buildAgent(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "agentconnect-vmagent")
	goTool, err := exec.LookPath("go") // go test puts its own first on PATH
	if err != nil {
		t.Skipf("no go tool to build the agent with: %v", err)
	}
	cmd := exec.Command(goTool, "build", "-o", out, "../cmd/agentconnect-vmagent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, b)
	}
	return out
}

// cpioWriter writes a newc cpio archive, the initramfs format.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

func (c *cpioWriter) entry(name string, mode uint32, rdevMajor, rdevMinor int, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	var b bytes.Buffer
	b.WriteString(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(data)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	_, c.err = c.w.Write(b.Bytes())
}

func (c *cpioWriter) dir(name string) { c.entry(name, syscall.S_IFDIR|0o755, 0, 0, nil) }

func (c *cpioWriter) file(t *testing.T, name, src string, perm uint32) {
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	c.entry(name, syscall.S_IFREG|perm, 0, 0, b)
}

// buildInitramfs packs the agent as /init, busybox, and the modules the
// agent loads with their dependencies.
func buildInitramfs(t *testing.T, k vmKernel, agent string) string {
	t.Helper()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	c := &cpioWriter{w: zw}
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp", "bin", "sbin", "etc", "lib", "lib/modules"} {
		c.dir(d)
	}
	c.entry("dev/console", syscall.S_IFCHR|0o600, 5, 1, nil)
	c.file(t, "init", agent, 0o755)
	c.file(t, "bin/busybox", busybox, 0o755)
	c.entry("bin/sh", syscall.S_IFLNK|0o777, 0, 0, []byte("busybox"))

	mods := "lib/modules/" + k.release
	f, err := os.Open(filepath.Join(k.modules, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	ix, err := parseModulesDep(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	files, missing := ix.loadOrder(append(append(serialModules, vsockModules...), setupModules...))
	if len(missing) > 0 {
		t.Logf("modules not in %s (built in, or absent): %v", k.release, missing)
	}
	dirs := map[string]bool{}
	c.dir(mods)
	for _, file := range files {
		for d := filepath.Dir(file); d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range sortedKeys(dirs) {
		c.dir(mods + "/" + d)
	}
	var dep strings.Builder
	for _, file := range files {
		c.file(t, mods+"/"+file, filepath.Join(k.modules, file), 0o644)
		fmt.Fprintf(&dep, "%s:", file)
		for _, d := range ix.deps[moduleName(file)] {
			fmt.Fprintf(&dep, " %s", ix.path[d])
		}
		dep.WriteString("\n")
	}
	c.entry(mods+"/modules.dep", syscall.S_IFREG|0o644, 0, 0, []byte(dep.String()))
	c.file(t, mods+"/modules.builtin", filepath.Join(k.modules, "modules.builtin"), 0o644)
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if c.err != nil {
		t.Fatal(c.err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "initrd.gz")
	if err := os.WriteFile(out, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("initramfs: %d modules, %d KiB", len(files), gz.Len()/1024)
	return out
}

func sortedKeys(m map[string]bool) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	// Parents before children: shorter paths first, then by name.
	for i := range keys {
		for j := i + 1; j < len(keys); j++ {
			if len(keys[j]) < len(keys[i]) || (len(keys[j]) == len(keys[i]) && keys[j] < keys[i]) {
				keys[i], keys[j] = keys[j], keys[i]
			}
		}
	}
	return keys
}

// vm is a QEMU process running the agent.
type vm struct {
	cmd     *exec.Cmd
	sock    string
	console string
	started time.Time
	exited  chan struct{}
	err     error // once exited
}

// bootVM starts QEMU with the agent's serial port on a socket and extra
// arguments (disks, shares).
func bootVM(t *testing.T, k vmKernel, initrd string, memMiB int, extra ...string) *vm {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmagent-vm-") // short: a unix socket path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	v := &vm{sock: filepath.Join(dir, "agent.sock"), console: filepath.Join(dir, "console.log"), exited: make(chan struct{})}
	args := []string{
		"-accel", "tcg", "-M", "q35", "-m", fmt.Sprint(memMiB), "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none",
		"-serial", "file:" + v.console, "-no-reboot",
		"-kernel", k.vmlinuz, "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 agentconnect.transport=serial",
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=agent,path=" + v.sock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + vmtransport.SerialPortName,
	}
	args = append(args, extra...)
	v.cmd = exec.Command(qemuBinary, args...)
	var stderr bytes.Buffer
	v.cmd.Stderr = &stderr
	v.started = time.Now()
	if err := v.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		v.err = v.cmd.Wait()
		if stderr.Len() > 0 {
			t.Logf("qemu stderr: %s", stderr.String())
		}
		close(v.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-v.exited:
		default:
			v.cmd.Process.Kill()
			<-v.exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(v.console)
			t.Logf("guest console:\n%s", b)
		}
	})
	return v
}

// connect waits for the agent and returns a ttrpc client of its API.
func (v *vm) connect(t *testing.T) (vmagentv1.VMAgentService, *vmtransport.SerialClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	sc, err := vmtransport.NewSerialClient(ctx, v.sock, vmtransport.WithLogf(t.Logf))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	conn, err := vmtransport.DialWithRetry(ctx, sc, vmtransport.DefaultRetryEvery)
	if err != nil {
		t.Fatal(err)
	}
	if err := vmtransport.WritePreface(conn, vmtransport.KindTTRPC, ""); err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	t.Cleanup(func() { client.Close() })
	return vmagentv1.NewVMAgentClient(client), sc
}

// stream opens the stdio stream kind of process id.
func stream(t *testing.T, sc *vmtransport.SerialClient, kind, id string) net.Conn {
	t.Helper()
	conn, err := sc.Dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := vmtransport.WritePreface(conn, kind, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// run execs args in the guest with stdout and stderr streams and returns
// them with the exit.
func runInGuest(t *testing.T, api vmagentv1.VMAgentService, sc *vmtransport.SerialClient, id string, args ...string) (stdoutText, stderrText string, code int32, reason string) {
	t.Helper()
	out := stream(t, sc, vmtransport.KindStdout, id)
	errc := stream(t, sc, vmtransport.KindStderr, id)
	var wg sync.WaitGroup
	var outB, errB []byte
	wg.Add(2)
	go func() { defer wg.Done(); outB, _ = io.ReadAll(out) }()
	go func() { defer wg.Done(); errB, _ = io.ReadAll(errc) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := api.Exec(ctx, &vmagentv1.ExecRequest{
		Id: id, Args: args, Env: []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"}, Stdout: true, Stderr: true,
	}); err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	w, err := api.Wait(ctx, &vmagentv1.WaitRequest{Id: id})
	if err != nil {
		t.Fatalf("wait %s: %v", id, err)
	}
	wg.Wait()
	return string(outB), string(errB), w.GetExitCode(), w.GetReason()
}

// shutdown asks the agent to power off and checks QEMU exits with 0.
func (v *vm) shutdown(t *testing.T, api vmagentv1.VMAgentService) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := api.Shutdown(ctx, &vmagentv1.ShutdownRequest{}); err != nil {
		t.Errorf("shutdown: %v", err)
	}
	select {
	case <-v.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("QEMU still runs 30s after Shutdown")
	}
	if v.err != nil {
		t.Errorf("QEMU exited with %v, want status 0", v.err)
	}
}

func TestVMBootHealthExecShutdown(t *testing.T) {
	k := needKernel(t)
	initrd := buildInitramfs(t, k, buildAgent(t))
	v := bootVM(t, k, initrd, 512)
	api, sc := v.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := api.Health(ctx, &vmagentv1.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Health answered %v after QEMU started (guest uptime %dms, kernel %s, agent %s)",
		time.Since(v.started).Round(time.Millisecond), h.GetUptimeMs(), h.GetKernel(), h.GetVersion())
	if b, err := os.ReadFile(v.console); err == nil {
		t.Logf("guest console so far:\n%s", b)
	}
	if h.GetKernel() != k.release {
		t.Errorf("Health kernel = %q, want %q", h.GetKernel(), k.release)
	}

	out, _, code, reason := runInGuest(t, api, sc, "uname", "/bin/busybox", "uname", "-r")
	t.Logf("busybox uname -r in the guest: %q", strings.TrimSpace(out))
	if strings.TrimSpace(out) != k.release || code != 0 {
		t.Errorf("busybox uname -r = %q, exit %d (%s); want %q, exit 0", out, code, reason, k.release)
	}
	_, _, code, reason = runInGuest(t, api, sc, "missing", "no-such-command")
	if code != 127 || !strings.Contains(reason, "not found") {
		t.Errorf("a missing command: exit %d (%q), want 127 with the reason", code, reason)
	}
	out, _, code, _ = runInGuest(t, api, sc, "pid", "/bin/sh", "-c", "echo $$ $PPID; cat /proc/1/comm")
	t.Logf("sh -c 'echo $$ $PPID; cat /proc/1/comm' = %q, exit %d", out, code)
	if f := strings.Fields(out); len(f) != 3 || f[1] != "1" {
		t.Errorf("a process's parent is %q, want the agent, PID 1", out)
	}

	// PID 1 reaps the orphans.
	runInGuest(t, api, sc, "orphans", "/bin/sh", "-c", "for i in 1 2 3 4 5; do (/bin/busybox sleep 0.1 &); done")
	time.Sleep(time.Second)
	out, _, _, _ = runInGuest(t, api, sc, "ps", "/bin/sh", "-c", "cat /proc/[0-9]*/stat")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "Z" {
			t.Errorf("a zombie in the guest: %s", line)
		}
	}

	// Signal every process: the kernel spares PID 1, the agent.
	sleeper := stream(t, sc, vmtransport.KindStdout, "sleeper")
	if _, err := api.Exec(ctx, &vmagentv1.ExecRequest{Id: "sleeper", Args: []string{"/bin/sh", "-c", "/bin/busybox setsid /bin/busybox sleep 100 & echo started; wait"}, Stdout: true}); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(sleeper).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("sleeper: %q, %v", line, err)
	}
	if _, err := api.Signal(ctx, &vmagentv1.SignalRequest{Id: "sleeper", Signal: uint32(syscall.SIGKILL), All: true}); err != nil {
		t.Fatal(err)
	}
	if w, err := api.Wait(ctx, &vmagentv1.WaitRequest{Id: "sleeper"}); err != nil || w.GetExitCode() != 137 {
		t.Errorf("sleeper after SIGKILL to all: %v, %v; want exit 137", w, err)
	}
	out, _, _, _ = runInGuest(t, api, sc, "after-kill", "/bin/sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
	if strings.Contains(out, "sleep 100") {
		t.Errorf("a setsid sleep survived SIGKILL to every process: %q", out)
	}

	// The host goes away and comes back (the shim restarts): the guest
	// reopens its port and waits for it.
	sc.Close()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	api, sc = v.connect(t)
	if _, err := api.Health(ctx, &vmagentv1.HealthRequest{}); err != nil {
		t.Fatalf("health after reconnecting: %v", err)
	}
	t.Logf("reconnected in %v", time.Since(start).Round(time.Millisecond))
	if w, err := api.Wait(ctx, &vmagentv1.WaitRequest{Id: "uname"}); err != nil || w.GetExitCode() != 0 {
		t.Errorf("wait for an earlier process after reconnecting: %v, %v", w, err)
	}
	out, _, _, _ = runInGuest(t, api, sc, "again", "/bin/busybox", "echo", "still here")
	if out != "still here\n" {
		t.Errorf("exec after reconnecting: %q", out)
	}
	out, _, _, _ = runInGuest(t, api, sc, "rss", "/bin/sh", "-c", "grep VmRSS /proc/1/status")
	t.Logf("the agent's memory: %s", strings.TrimSpace(out))
	v.shutdown(t, api)
	if b, err := os.ReadFile(v.console); err == nil {
		t.Logf("guest console:\n%s", b)
	}
}

const virtiofsd = "/usr/lib/qemu/virtiofsd"

// mkext4 makes an ext4 image of sizeMiB at path, filled from dir if given.
func mkext4(t *testing.T, path string, sizeMiB int, dir string) {
	t.Helper()
	args := []string{"-q", "-F", "-t", "ext4", "-L", filepath.Base(path)}
	if dir != "" {
		args = append(args, "-d", dir)
	}
	args = append(args, path, fmt.Sprintf("%dM", sizeMiB))
	if out, err := exec.Command("mke2fs", args...).CombinedOutput(); err != nil {
		t.Fatalf("mke2fs %s: %v\n%s", path, err, out)
	}
}

// startVirtiofsd shares dir on a vhost-user socket and returns its path.
func startVirtiofsd(t *testing.T, dir, sockDir, name string) string {
	t.Helper()
	sock := filepath.Join(sockDir, name+".sock")
	cmd := exec.Command(virtiofsd, "--socket-path="+sock, "-o", "source="+dir, "-o", "cache=none")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("virtiofsd %s: %s", name, stderr.String())
		}
	})
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("virtiofsd made no socket in 10s: %s", stderr.String())
		}
	}
}

// imageDir is a minimal root filesystem: busybox, and an /etc with the
// symlinks real images have.
func imageDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"bin", "etc", "home/agent", "var/lib"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755)
	for _, tool := range []string{"sh", "cat", "hostname", "ip", "mount", "ls", "echo", "touch"} {
		os.Symlink("busybox", filepath.Join(dir, "bin", tool))
	}
	os.Symlink("/run/systemd/resolve/stub-resolv.conf", filepath.Join(dir, "etc", "resolv.conf"))
	os.Symlink("/proc/self/fd", filepath.Join(dir, "home", "agent", "sneaky"))
	os.WriteFile(filepath.Join(dir, "etc", "image-release"), []byte("test image\n"), 0o644)
	return dir
}

func TestVMSetup(t *testing.T) {
	k := needKernel(t)
	if _, err := os.Stat(virtiofsd); err != nil {
		t.Skipf("%s is missing (apt-get install qemu-system-x86)", virtiofsd)
	}
	for _, tool := range []string{"mke2fs", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (apt-get install e2fsprogs)", tool)
		}
	}
	initrd := buildInitramfs(t, k, buildAgent(t))
	disks := t.TempDir()
	rootImg, upperImg, dockerImg := filepath.Join(disks, "root.img"), filepath.Join(disks, "upper.img"), filepath.Join(disks, "docker.img")
	mkext4(t, rootImg, 32, imageDir(t))
	mkext4(t, upperImg, 64, "")
	mkext4(t, dockerImg, 32, "")
	work, data := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(work, "from-host"), []byte("shared\n"), 0o644)
	os.WriteFile(filepath.Join(data, "config"), []byte("read-only\n"), 0o644)
	sockDir, err := os.MkdirTemp("", "vmagent-vfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	workSock := startVirtiofsd(t, work, sockDir, "work")
	dataSock := startVirtiofsd(t, data, sockDir, "data")

	const mem = 512
	v := bootVM(t, k, initrd, mem,
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", mem), "-machine", "memory-backend=mem",
		"-drive", "file="+rootImg+",if=none,id=root,format=raw,readonly=on", "-device", "virtio-blk-pci,drive=root,serial=image",
		"-drive", "file="+upperImg+",if=none,id=upper,format=raw", "-device", "virtio-blk-pci,drive=upper,serial=upper",
		"-drive", "file="+dockerImg+",if=none,id=docker,format=raw", "-device", "virtio-blk-pci,drive=docker,serial=docker",
		"-chardev", "socket,id=vfs0,path="+workSock, "-device", "vhost-user-fs-pci,chardev=vfs0,tag=work",
		"-chardev", "socket,id=vfs1,path="+dataSock, "-device", "vhost-user-fs-pci,chardev=vfs1,tag=data",
		// A NIC on a hub with no other port: the guest gets an eth0 that
		// reaches nothing.
		"-netdev", "hubport,id=n0,hubid=0", "-device", "virtio-net-pci,netdev=n0",
	)
	api, sc := v.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := &vmagentv1.SetupRequest{
		Root:   &vmagentv1.Disk{Serial: "image", Readonly: true},
		Upper:  &vmagentv1.Disk{Serial: "upper"},
		Docker: &vmagentv1.Disk{Serial: "docker"},
		Shares: []*vmagentv1.Share{
			{Tag: "work", Target: "/home/agent/work"},
			{Tag: "data", Target: "/opt/data", Readonly: true},
		},
		Network: &vmagentv1.Network{Address: "192.168.127.2/24", Gateway: "192.168.127.1", Hostname: "session-1"},
		Entropy: make([]byte, 32), TimeUnixNano: time.Now().UnixNano(),
	}
	start := time.Now()
	if _, err := api.Setup(ctx, req); err != nil {
		t.Fatalf("setup: %v", err)
	}
	t.Logf("Setup took %v", time.Since(start).Round(time.Millisecond))
	if _, err := api.Setup(ctx, req); err == nil {
		t.Error("a second Setup succeeded")
	}

	check := func(id, script string, want ...string) string {
		t.Helper()
		out, errOut, code, reason := runInGuest(t, api, sc, id, "/bin/sh", "-c", script)
		if code != 0 {
			t.Errorf("%s: exit %d (%s), stderr %q", script, code, reason, errOut)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", script, w, out)
			}
		}
		return out
	}
	mounts := check("mounts", "cat /proc/mounts",
		"overlay / overlay", "/var/lib/docker ext4 rw", "work /home/agent/work virtiofs rw", "data /opt/data virtiofs ro",
		"proc /proc proc", "sysfs /sys sysfs", "/dev devtmpfs", "devpts /dev/pts devpts", "/dev/shm tmpfs", "/tmp tmpfs",
		"/run tmpfs", "cgroup2 /sys/fs/cgroup cgroup2")
	t.Logf("guest mounts after Setup:\n%s", mounts)
	check("image", "cat /etc/image-release; cat /home/agent/work/from-host; cat /opt/data/config", "test image", "shared", "read-only")
	check("write", "echo from-guest > /home/agent/work/from-guest && echo kept > /root-file && mkdir -p /var/lib/docker/x")
	if b, err := os.ReadFile(filepath.Join(work, "from-guest")); err != nil || string(b) != "from-guest\n" {
		t.Errorf("the guest's write to the share: %q, %v", b, err)
	}
	if _, _, code, _ := runInGuest(t, api, sc, "ro", "/bin/sh", "-c", "echo x > /opt/data/y"); code == 0 {
		t.Error("a write to the read-only share succeeded")
	}
	check("net", "hostname; cat /etc/resolv.conf /etc/hostname /etc/hosts; ip addr show eth0; ip route",
		"session-1", "nameserver 192.168.127.1", "inet 192.168.127.2/24", "default via 192.168.127.1 dev eth0", "127.0.1.1\tsession-1")

	v.shutdown(t, api)
	// The overlay's writes persist on the upper disk.
	out, err := exec.Command("debugfs", "-R", "cat /upper/root-file", upperImg).Output()
	if err != nil || string(out) != "kept\n" {
		t.Errorf("/root-file on the upper disk after shutdown: %q, %v; want %q", out, err, "kept\n")
	}
}
