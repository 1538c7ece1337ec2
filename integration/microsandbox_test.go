package integration

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/testdns"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmnet"
)

// The microsandbox tests boot real VMs: QEMU under TCG (this machine and CI
// have no /dev/kvm) with the serial transport, from the image `make image`
// put beside the binaries. Each boot takes a few seconds, so each test
// boots as few VMs as its checks need.

// requireMicrosandbox skips unless VMs can boot here from the built image.
func requireMicrosandbox(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	if _, err := os.Stat(filepath.Join(binDir, "image", "image.json")); err != nil {
		t.Skipf("no guest image in %s/image (make image builds it; make test does)", binDir)
	}
}

// vmConfig is a daemon config for VM tests: small TCG VMs over the serial
// transport, with extra microsandbox settings.
func vmConfig(extra string) string {
	return `{"sandbox": {"microsandbox": {"accelerator": "tcg", "transport": "serial", "cpus": 1, "memoryMiB": 512` + extra + `}}}`
}

func startVMDaemon(t *testing.T, extra string) (string, *daemon) {
	t.Helper()
	h := newHome(t)
	if err := os.WriteFile(filepath.Join(h, "config.json"), []byte(vmConfig(extra)), 0o600); err != nil {
		t.Fatal(err)
	}
	return h, startDaemon(t, h)
}

// waitSession waits until a session is not running and returns it.
func waitSession(t *testing.T, h, id string) session {
	t.Helper()
	r := run(t, h, "", "session", "wait", id)
	if r.code != 0 && show(t, h, id).State == "running" {
		t.Fatalf("session wait %s: exit %d: %s", id, r.code, r.stderr)
	}
	return show(t, h, id)
}

// startAndWait starts a session of agent (or resumes id), waits for it and
// returns its id and the output of this run.
func startAndWait(t *testing.T, h, agentName, id string) (string, string) {
	t.Helper()
	return startAndWaitWithin(t, h, agentName, id, 0)
}

// startAndWaitWithin is startAndWait for a run that may take longer than
// a CLI call's bound (within > 0): it polls the session for that long, once
// a second (a CLI call each time, and TCG needs the CPU).
func startAndWaitWithin(t *testing.T, h, agentName, id string, within time.Duration) (string, string) {
	t.Helper()
	before := ""
	if id == "" {
		id = strings.TrimSpace(ok(t, h, "session", "start", agentName))
	} else {
		before = ok(t, h, "session", "logs", id)
		ok(t, h, "session", "resume", id)
	}
	var s session
	if within == 0 {
		s = waitSession(t, h, id)
	} else {
		deadline := time.Now().Add(within)
		for s = show(t, h, id); s.State == "running"; s = show(t, h, id) {
			if time.Now().After(deadline) {
				t.Fatalf("session %s still runs after %v; shim log:\n%s", id, within, shimLog(h, id))
			}
			time.Sleep(time.Second)
		}
	}
	out := strings.TrimPrefix(ok(t, h, "session", "logs", id), before)
	if s.State != "exited" || s.ExitCode != 0 {
		t.Fatalf("session %s: state %s, exit %d, reason %q; output:\n%s\nshim log:\n%s", id, s.State, s.ExitCode, s.Reason, out, shimLog(h, id))
	}
	return id, out
}

func shimLog(h, id string) string {
	b, _ := os.ReadFile(filepath.Join(h, "sessions", id, "shim.log"))
	return string(b)
}

// TestMicrosandboxBoundary: the guest's own kernel; the workspace shared
// both ways; a read-only mount that stays read-only; nothing of the host
// that was not shared, the daemon's home above all.
func TestMicrosandboxBoundary(t *testing.T) {
	requireMicrosandbox(t)
	h, _ := startVMDaemon(t, "")
	ro := t.TempDir()
	os.WriteFile(filepath.Join(ro, "data"), []byte("read-only data\n"), 0o644)
	secret := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(secret, []byte("x"), 0o644)

	ok(t, h, "agent", "create", "box", "--strategy", "microsandbox", "--mount", ro+":/opt/ro:ro", "--", "bash", "-c", fmt.Sprintf(`
echo "kernel $(uname -r)"
echo "host-file $(cat from-host)"
echo guest-wrote > from-guest
echo "ro-data $(cat /opt/ro/data)"
if echo x > /opt/ro/new 2>/dev/null; then echo "ro-write allowed"; else echo "ro-write refused"; fi
if touch /opt/ro/data 2>/dev/null; then echo "ro-touch allowed"; else echo "ro-touch refused"; fi
for p in %[1]s/config.json %[1]s/sessions %[1]s/run %[2]s; do [ -e "$p" ] && echo "visible $p"; done
echo "home $HOME"
echo "pwd $PWD"
echo done
`, h, secret))
	ws := filepath.Join(agentDir(t, h, "box"), "workspace")
	os.WriteFile(filepath.Join(ws, "from-host"), []byte("host-wrote\n"), 0o644)

	_, out := startAndWait(t, h, "box", "")
	got := parseCodes(out)
	hostKernel, _ := exec.Command("uname", "-r").Output()
	imgKernel := guestKernel(t)
	for k, want := range map[string]string{
		"kernel": imgKernel, "host-file": "host-wrote", "ro-data": "read-only data",
		"ro-write": "refused", "ro-touch": "refused", "pwd": ws,
		"home": filepath.Join(agentDir(t, h, "box"), "home"),
	} {
		if got[k] != want {
			t.Errorf("%s = %q, want %q\n%s", k, got[k], want, out)
		}
	}
	if got["kernel"] == strings.TrimSpace(string(hostKernel)) {
		t.Errorf("the guest runs the host's kernel %s", hostKernel)
	}
	if strings.Contains(out, "visible") {
		t.Errorf("host paths that were not shared are visible in the guest:\n%s", out)
	}
	if _, ok := got["done"]; !ok && !strings.Contains(out, "done") {
		t.Errorf("the script did not finish:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(ws, "from-guest")); err != nil || string(b) != "guest-wrote\n" {
		t.Errorf("the guest's workspace file on the host: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(ro, "new")); err == nil {
		t.Errorf("the guest wrote into a read-only mount")
	}
}

// guestKernel is the kernel version of the built image.
func guestKernel(t *testing.T) string {
	t.Helper()
	var m struct {
		Kernel string `json:"kernelVersion"`
	}
	b, err := os.ReadFile(filepath.Join(binDir, "image", "image.json"))
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err != nil || m.Kernel == "" {
		t.Fatalf("image.json has no kernel: %v: %s", err, b)
	}
	return m.Kernel
}

// vmProcesses lists the live processes whose command line contains s.
func vmProcesses(s string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(s)) {
			continue
		}
		if st, err := procstat.Read(pid); err == nil && !st.Dead() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// qemuOf finds the QEMU process of a session by its VM directory.
func qemuOf(h, id string) int {
	for _, pid := range vmProcesses(filepath.Join(h, "vms", id) + "/") {
		if cmd, _ := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "comm")); strings.HasPrefix(string(cmd), "qemu-system") {
			return pid
		}
	}
	return 0
}

// vmRunDirs lists the VMs' socket directories of a home.
func vmRunDirs(h string) []string {
	dirs, _ := filepath.Glob(filepath.Join(home.Layout{Root: h}.FindSocketDir(), "*.vm"))
	return dirs
}

// TestMicrosandboxRecovery: a VM session outlives a SIGKILLed supervisor
// and is adopted with every byte of its output; a VM whose QEMU dies
// leaves a lost session and nothing running or listening behind, and
// removing the session removes its disks.
func TestMicrosandboxRecovery(t *testing.T) {
	requireMicrosandbox(t)
	h, d := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "long", "--strategy", "microsandbox", "--", "bash", "-c",
		`echo started; for i in $(seq 1 40); do echo "tick $i"; [ -e stop ] && break; sleep 0.25; done; echo end`)
	ws := filepath.Join(agentDir(t, h, "long"), "workspace")
	id := strings.TrimSpace(ok(t, h, "session", "start", "long"))
	eventually(t, 60*time.Second, "the session's output", func() bool {
		return strings.Contains(ok(t, h, "session", "logs", id), "tick 2")
	})
	qemu := qemuOf(h, id)
	if qemu == 0 {
		t.Fatalf("no QEMU process for session %s", id)
	}
	d.kill9()
	if !procstat.Alive(qemu, 0) {
		t.Fatal("QEMU died with the supervisor")
	}
	d.restart()
	if s := show(t, h, id); s.State != "running" {
		t.Fatalf("after a supervisor SIGKILL the session is %s (%s)", s.State, s.Reason)
	}
	os.WriteFile(filepath.Join(ws, "stop"), nil, 0o644)
	s := waitSession(t, h, id)
	out := ok(t, h, "session", "logs", id)
	if s.State != "exited" || s.ExitCode != 0 || !strings.HasSuffix(out, "\nend\n") {
		t.Fatalf("adopted session: %s exit %d (%s); output:\n%s", s.State, s.ExitCode, s.Reason, out)
	}
	// Every tick, in order: no byte lost or doubled across the adoption.
	want := "started\n"
	for i := 1; !strings.HasPrefix(out, want+"end\n"); i++ {
		want += fmt.Sprintf("tick %d\n", i)
		if !strings.HasPrefix(out, want) {
			t.Fatalf("output is not every tick in order (want %q next):\n%s", fmt.Sprintf("tick %d", i), out)
		}
	}
	os.Remove(filepath.Join(ws, "stop"))

	// Kill QEMU under a running session.
	ok(t, h, "session", "resume", id)
	eventually(t, 60*time.Second, "the resumed session's output", func() bool {
		return strings.Count(ok(t, h, "session", "logs", id), "started") == 2
	})
	qemu = qemuOf(h, id)
	runDirs := vmRunDirs(h)
	if qemu == 0 || len(runDirs) != 1 || len(vmProcesses(runDirs[0]+"/fs0.sock")) == 0 {
		t.Fatalf("running VM: QEMU %d, socket dirs %v", qemu, runDirs)
	}
	// virtiofsd serving the workspace, found by its socket in the run's
	// socket directory.
	helpers := runDirs[0] + "/fs"
	syscall.Kill(qemu, syscall.SIGKILL)
	s = waitSession(t, h, id)
	if s.State != "lost" || !strings.Contains(s.Reason, "QEMU") {
		t.Errorf("after QEMU was killed: state %s, reason %q; want lost with a reason naming QEMU", s.State, s.Reason)
	}
	eventually(t, 20*time.Second, "the VM's helpers and sockets are gone", func() bool {
		return len(vmProcesses(helpers)) == 0 && len(vmRunDirs(h)) == 0 && qemuOf(h, id) == 0
	})
	if _, err := os.Stat(filepath.Join(h, "vms", id)); err != nil {
		t.Errorf("a lost session's disks are gone before the session is: %v", err)
	}
	ok(t, h, "session", "rm", id)
	if _, err := os.Stat(filepath.Join(h, "vms", id)); !os.IsNotExist(err) {
		t.Errorf("session rm left its VM: %v", err)
	}
}

// tinyImage is an OCI image of the host's static busybox: enough of a
// root for a shell script, and small enough to push in milliseconds.
func tinyImage(t *testing.T) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("no /bin/busybox (make deps installs busybox-static)")
	}
	if f, err := elf.NewFile(bytes.NewReader(bb)); err != nil || hasInterp(f) {
		t.Skip("/bin/busybox is not statically linked (make deps installs busybox-static)")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin", "dev", "etc", "proc", "root", "run", "sys", "tmp", "var"} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755})
	}
	// No account files: the guest adds the runtime user. /var/tmp as an
	// image has it, for VM-local files the runtime user writes.
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "var/tmp/", Mode: 0o1777})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, applet := range []string{"sh", "cat", "wc", "uname", "ls", "sleep", "id"} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777})
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func hasInterp(f *elf.File) bool {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return true
		}
	}
	return false
}

// TestMicrosandboxLifecycle: a custom image from a registry on loopback; a
// VM-local file kept across stop and resume and across a new tag of the
// same image; a VM rebuilt (the file gone, the workspace kept) when its
// memory changes.
func TestMicrosandboxLifecycle(t *testing.T) {
	requireMicrosandbox(t)
	img := tinyImage(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	push := func(tag string) string {
		ref := host + "/tiny:" + tag
		r, err := name.ParseReference(ref)
		if err == nil {
			err = remote.Write(r, img)
		}
		if err != nil {
			t.Fatalf("push %s: %v", ref, err)
		}
		return ref
	}
	h, _ := startVMDaemon(t, `, "image": "`+push("v1")+`"`)
	ok(t, h, "agent", "create", "life", "--strategy", "microsandbox", "--", "/bin/sh", "-c", `
echo "user $(id -un):$(id -u)"
echo x >> /var/tmp/vmlocal; echo "local $(wc -l < /var/tmp/vmlocal)"
echo x >> ws-file; echo "workspace $(wc -l < ws-file)"
if [ -e /usr/bin/node ]; then echo "image default"; else echo "image tiny"; fi
`)
	check := func(what, out, local, workspace string) {
		t.Helper()
		got := parseCodes(out)
		if got["user"] != "agent:10001" || got["image"] != "tiny" || got["local"] != local || got["workspace"] != workspace {
			t.Errorf("%s: user %q, image %q, VM-local lines %q, workspace lines %q; want agent:10001, tiny, %s, %s\n%s",
				what, got["user"], got["image"], got["local"], got["workspace"], local, workspace, out)
		}
	}
	id, out := startAndWait(t, h, "life", "")
	check("first run", out, "1", "1")
	_, out = startAndWait(t, h, "life", id)
	check("resumed", out, "2", "2")
	images, _ := os.ReadDir(filepath.Join(h, "images"))

	// The same content under a new tag: the same VM.
	os.WriteFile(filepath.Join(h, "config.json"), []byte(vmConfig(`, "image": "`+push("v2")+`"`)), 0o600)
	ok(t, h, "restart")
	_, out = startAndWait(t, h, "life", id)
	check("after a new tag of the same image", out, "3", "3")
	if again, _ := os.ReadDir(filepath.Join(h, "images")); len(again) != len(images) {
		t.Errorf("a new tag of the same image was prepared again: images/ had %d entries, now %d", len(images), len(again))
	}

	// More memory: a new VM; the workspace stays.
	ok(t, h, "agent", "edit", "life", "--memory-mib", "640")
	_, out = startAndWait(t, h, "life", id)
	check("after a memory change", out, "1", "4")
	if vms, _ := os.ReadDir(filepath.Join(h, "vms", id)); len(vms) != 1 {
		t.Errorf("vms/%s holds %d VMs after the rebuild, want 1", id, len(vms))
	}
}

// TestMicrosandboxStopDuringBoot: a stop that reaches a shim while its VM
// still boots (a new supervisor adopted the shim mid-start) is kept and
// delivered once the runtime runs: the session ends 143 at once, rather
// than the stop being dropped and the runtime running to the SIGKILL.
func TestMicrosandboxStopDuringBoot(t *testing.T) {
	requireMicrosandbox(t)
	h, d := startVMDaemon(t, "")
	ok(t, h, "agent", "create", "slow", "--strategy", "microsandbox", "--", "sleep", "120")
	started := make(chan result, 1)
	go func() {
		cmd := exec.Command(agentconnect(), "--home", h, "session", "start", "slow")
		out, _ := cmd.Output()
		started <- result{stdout: string(out)}
	}()
	// The session exists once its shim wrote bootstrap.json; the VM boots
	// for seconds after that (TCG).
	var id string
	eventually(t, 30*time.Second, "the session's shim to start", func() bool {
		entries, _ := os.ReadDir(filepath.Join(h, "sessions"))
		for _, e := range entries {
			if _, err := os.Stat(filepath.Join(h, "sessions", e.Name(), "bootstrap.json")); err == nil {
				id = e.Name()
				return true
			}
		}
		return false
	})
	d.kill9()
	<-started // its answer went with the supervisor
	d.restart()
	stopped := show(t, h, strings.TrimSpace(ok(t, h, "session", "stop", "--timeout", "60", id)))
	if stopped.State != "exited" || stopped.ExitCode != 128+int(syscall.SIGTERM) {
		t.Fatalf("stopped during its boot: %+v, want exited %d (the SIGTERM kept for the runtime)", stopped, 128+int(syscall.SIGTERM))
	}
	if log, _ := os.ReadFile(filepath.Join(h, "sessions", id, "shim.log")); !strings.Contains(string(log), "signal while the run starts") {
		t.Log("the VM had booted before the stop came: the stop during a start was not exercised this time")
	}
}

// vmNetScript: conn NAME HOST PORT prints "NAME connected" when a raw TCP
// connection (bash's /dev/tcp: no proxy variables involved) gets an answer,
// else "NAME refused".
const vmNetScript = `
conn() {
	if out=$(timeout 8 bash -c "exec 3<>/dev/tcp/$2/$3 && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && head -c 64 <&3" 2>/dev/null) && [ -n "$out" ]; then
		echo "$1 connected"
	else
		echo "$1 refused"
	fi
}
# A server on port 7000 in this VM; every session of the test runs one.
node -e 'require("net").createServer(c => c.end("vm\n")).listen(7000, () => console.log("listening 7000"))' &
for i in $(seq 100); do conn own-port 127.0.0.1 7000 | grep -q connected && break; sleep 0.1; done
conn own-port 127.0.0.1 7000
`

// vmNetRelease ends a session of vmNetScript once the test created
// "release" in its workspace (or after 60 s).
const vmNetRelease = `
echo checked
for i in $(seq 600); do [ -e release ] && break; sleep 0.1; done
`

// TestMicrosandboxNetwork: each VM has its own network stack behind the
// session's policy. Raw TCP reaches an allowed public server, not a private
// address; the host's loopback only through an entry; a denied name is a
// violation; two VMs listen on the same port at once.
func TestMicrosandboxNetwork(t *testing.T) {
	requireMicrosandbox(t)
	startPublicNet(t)
	entry := loopbackServer(t, "entry")
	other := loopbackServer(t, "other")
	dns := testdns.Start(t, map[string][]netip.Addr{
		"public.test":  {netip.MustParseAddr(publicServerIP)},
		"blocked.test": {netip.MustParseAddr(publicServerIP)},
		"private.test": {netip.MustParseAddr(privateServerIP)},
	})
	h, _ := startVMDaemon(t, `, "resolver": "`+dns+`"`)

	// No allowlist: public destinations, never private ones or the host.
	ok(t, h, "agent", "create", "open", "--strategy", "microsandbox", "--deny-domain", "blocked.test", "--", "bash", "-c",
		vmNetScript+fmt.Sprintf(`
conn public-name public.test %[1]d
conn public-ip %[2]s %[1]d
conn private-ip %[3]s %[1]d
conn private-name private.test %[1]d
conn denied-name blocked.test %[1]d
conn host-loopback %[4]s %[5]d
`, publicPort, publicServerIP, privateServerIP, vmnet.HostIP, entry)+vmNetRelease)
	// An allowlist naming one loopback port of the host.
	ok(t, h, "agent", "create", "entry", "--strategy", "microsandbox", "--allow-domain", fmt.Sprintf("127.0.0.1:%d", entry), "--", "bash", "-c",
		vmNetScript+fmt.Sprintf(`
conn host-entry %[1]s %[2]d
conn host-entry-name %[3]s %[2]d
conn host-other %[1]s %[4]d
conn public-unlisted %[5]s %[6]d
`, vmnet.HostIP, entry, vmnet.HostName, other, publicServerIP, publicPort)+vmNetRelease)

	// Both at once, each listening on port 7000.
	ids := map[string]string{}
	for _, a := range []string{"open", "entry"} {
		ids[a] = strings.TrimSpace(ok(t, h, "session", "start", a))
	}
	outs := map[string]string{}
	for a, id := range ids {
		eventually(t, 90*time.Second, a+"'s checks", func() bool {
			outs[a] = ok(t, h, "session", "logs", id)
			return strings.Contains(outs[a], "checked") || show(t, h, id).State != "running"
		})
	}
	for a, id := range ids {
		if s := show(t, h, id); s.State != "running" {
			t.Fatalf("%s ended before it was released: %s exit %d (%s)\n%s", a, s.State, s.ExitCode, s.Reason, outs[a])
		}
	}
	for a, want := range map[string]map[string]string{
		"open": {
			"listening": "7000", "own-port": "connected", "public-name": "connected", "public-ip": "connected",
			"private-ip": "refused", "private-name": "refused", "denied-name": "refused", "host-loopback": "refused",
		},
		"entry": {
			"listening": "7000", "own-port": "connected", "host-entry": "connected", "host-entry-name": "connected",
			"host-other": "refused", "public-unlisted": "refused",
		},
	} {
		got := parseCodes(outs[a])
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q\n%s", a, k, got[k], v, outs[a])
			}
		}
	}
	for a, id := range ids {
		os.WriteFile(filepath.Join(agentDir(t, h, a), "workspace", "release"), nil, 0o644)
		if s := waitSession(t, h, id); s.State != "exited" || s.ExitCode != 0 {
			t.Errorf("%s: %s exit %d (%s)", a, s.State, s.ExitCode, s.Reason)
		}
	}

	// The refusals are violations of the session, and events.
	var shown struct {
		Violations []struct {
			Host   string `json:"host"`
			Reason string `json:"reason"`
		} `json:"violations"`
	}
	okJSON(t, h, &shown, "session", "show", ids["open"])
	reasons := map[string]string{}
	for _, v := range shown.Violations {
		reasons[v.Host] += v.Reason + "; "
	}
	if !strings.Contains(reasons["blocked.test"], "deniedDomains") || reasons[privateServerIP] == "" && reasons["private.test"] == "" {
		t.Errorf("violations of the open session: %+v", shown.Violations)
	}
	events := ok(t, h, "events", "--json")
	if !strings.Contains(events, `"session.violation"`) || !strings.Contains(events, "blocked.test") {
		t.Errorf("no session.violation event for blocked.test:\n%s", events)
	}
}

// loopbackServer listens on the host's loopback and answers every
// connection with its name; it returns the port.
func loopbackServer(t *testing.T, name string) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(name + "\n"))
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// TestMicrosandboxBadInput: bad VM settings, a malformed image and a
// missing kernel are clear errors, and none leaves a VM behind.
func TestMicrosandboxBadInput(t *testing.T) {
	requireMicrosandbox(t)

	// diskGiB: the daemon refuses the config; an agent its setting.
	h := newHome(t)
	writeConfig(t, h, vmConfig(`, "diskGiB": 0`))
	if out := runDaemonExpectFailure(t, h); !strings.Contains(out, "sandbox.microsandbox.diskGiB") {
		t.Errorf("diskGiB 0: %s", out)
	}
	writeConfig(t, h, vmConfig(""))
	startDaemon(t, h)
	for _, bad := range []string{"-1", "99999"} {
		r := run(t, h, "", "agent", "create", "disk", "--strategy", "microsandbox", "--disk-gib", bad, "--", "true")
		if r.code == 0 || !strings.Contains(r.stderr, "disk-gib") && !strings.Contains(r.stderr, "diskGiB") {
			t.Errorf("--disk-gib %s: exit %d: %s", bad, r.code, r.stderr)
		}
	}

	// An image that is not an image: a clear error at start, nothing kept.
	garbage := filepath.Join(t.TempDir(), "image.tar")
	os.WriteFile(garbage, []byte("not a tar archive"), 0o644)
	h2 := newHome(t)
	writeConfig(t, h2, vmConfig(`, "image": "archive:`+garbage+`"`))
	startDaemon(t, h2)
	ok(t, h2, "agent", "create", "img", "--strategy", "microsandbox", "--", "true")
	r := run(t, h2, "", "session", "start", "img")
	if r.code == 0 || !strings.Contains(r.stderr, "sandbox.microsandbox.image") {
		t.Errorf("session start with a malformed image: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("a malformed image: %s", r.stderr)
	checkNoVM(t, h2)

	// A malformed reference: the probe says why, and no agent gets it.
	writeConfig(t, h2, vmConfig(`, "image": "Not A Reference!"`))
	ok(t, h2, "restart")
	r = run(t, h2, "", "agent", "create", "badref", "--strategy", "microsandbox", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "sandbox.microsandbox.image") {
		t.Errorf("agent create with a malformed image reference: exit %d: %s", r.code, r.stderr)
	}
	t.Logf("a malformed reference: %s", r.stderr)

	// A missing kernel: binaries whose image directory lost vmlinuz.
	bin := t.TempDir()
	img := filepath.Join(bin, "image")
	os.Mkdir(img, 0o755)
	for _, f := range []string{"agentconnect", "agentconnect-shim", "agentconnect-shim-vm", "agentconnect-vmimage", "agentconnect-inject", "image/vmlinuz"} {
		data, err := os.ReadFile(filepath.Join(binDir, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(bin, f), data, 0o755)
	}
	for _, f := range []string{"initrd.img", "rootfs.img", "image.json"} {
		os.Symlink(filepath.Join(binDir, "image", f), filepath.Join(img, f))
	}
	h3 := newHome(t)
	writeConfig(t, h3, vmConfig(""))
	d := &daemon{t: t, home: h3, bin: filepath.Join(bin, "agentconnect")}
	d.start()
	t.Cleanup(d.cleanup)
	ok(t, h3, "agent", "create", "nokernel", "--strategy", "microsandbox", "--", "true")
	os.Remove(filepath.Join(img, "vmlinuz"))
	r = run(t, h3, "", "session", "start", "nokernel")
	if r.code == 0 || !strings.Contains(r.stderr, "vmlinuz") {
		t.Errorf("session start without a kernel: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("a missing kernel: %s", r.stderr)
	checkNoVM(t, h3)
	ok(t, h3, "restart")
	r = run(t, h3, "", "agent", "create", "nokernel2", "--strategy", "microsandbox", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "vmlinuz") {
		t.Errorf("agent create without a kernel: exit %d: %s", r.code, r.stderr)
	}
}

// checkNoVM fails if a home has a VM's disks, sockets or processes.
func checkNoVM(t *testing.T, h string) {
	t.Helper()
	if vms, _ := os.ReadDir(filepath.Join(h, "vms")); len(vms) != 0 {
		t.Errorf("a failed start left VMs: %v", vms)
	}
	if dirs := vmRunDirs(h); len(dirs) != 0 {
		t.Errorf("a failed start left socket directories: %v", dirs)
	}
	if p := vmProcesses(h + "/"); len(p) != 0 {
		t.Errorf("a failed start left processes: %v", p)
	}
}
