package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// dockerScript waits for the guest's Docker Engine, imports an image made
// from a root tarball (busybox, copied into the workspace by the test) when
// the VM lacks it, and runs it. It prints "info ok", "image kept" or
// "image absent", "run <what the container printed>", and "buildx ok",
// "compose ok" for the CLI plugins. With a file flood-console in the
// workspace, a container (root in the guest, as the docker group makes
// the runtime at will) writes 3 MiB to the VM's console and prints
// "console flooded".
const dockerScript = `
echo "user $(id -u)"
end=$(($(date +%s) + 240))
until docker info >/dev/null 2>&1 || [ "$(date +%s)" -ge "$end" ]; do sleep 0.5; done
if docker info >/dev/null 2>&1; then echo "info ok"; else echo "info failed"; tail -n 20 /var/log/dockerd.log; fi
if docker image inspect tiny:1 >/dev/null 2>&1; then echo "image kept"; else
	echo "image absent"
	mkdir -p /tmp/r/bin && cp busybox /tmp/r/bin/ && tar -C /tmp/r -c . | docker import - tiny:1 >/dev/null
fi
echo "run $(docker run --rm --network none tiny:1 /bin/busybox echo from-container 2>&1)"
[ ! -e flood-console ] || docker run --rm --network none --device /dev/ttyS0 tiny:1 /bin/busybox sh -c \
	'/bin/busybox head -c 3145728 /dev/zero | /bin/busybox tr "\\0" x >/dev/ttyS0 && echo "console flooded"'
docker buildx version >/dev/null 2>&1 && echo "buildx ok"
docker compose version >/dev/null 2>&1 && echo "compose ok"
`

// initScript answers "init-NAME ok" when a runtime run from the image's
// own tree (nothing mounted in) answers initialize.
const initScript = `
init() {
	n=$1; shift
	printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}' >/tmp/req-$n
	began=$(date +%s)
	timeout 240 "$@" </tmp/req-$n >/tmp/init-$n.out 2>/tmp/init-$n.err &
	p=$!
	for i in $(seq 240); do grep -q '"protocolVersion"' /tmp/init-$n.out 2>/dev/null && break; kill -0 $p 2>/dev/null || break; sleep 1; done
	if grep -q '"protocolVersion"' /tmp/init-$n.out; then echo "init-$n ok"; else echo "init-$n failed after $(($(date +%s) - began)) s: $(tail -c 300 /tmp/init-$n.err)"; fi
	kill $p 2>/dev/null; wait $p 2>/dev/null
}
`

// TestMicrosandboxImageDockerAndRuntimes: the default image runs Docker
// Engine on the VM's docker disk. docker info works (as the runtime user);
// an image made locally (docker import) runs; it is still there after stop
// and resume and gone after a rebuild; Buildx and Compose are there. The
// known runtimes in the image answer initialize with nothing mounted in.
// A container that floods the console leaves a bounded console.log.
func TestMicrosandboxImageDockerAndRuntimes(t *testing.T) {
	requireMicrosandbox(t)
	h, _ := startVMDaemon(t, "")
	var known []struct {
		Name    string   `json:"name"`
		Command []string `json:"command"`
	}
	if err := json.Unmarshal([]byte(ok(t, h, "runtime", "ls", "--known", "--json")), &known); err != nil {
		t.Fatal(err)
	}
	// The runtimes first, all at once on the VM's two CPUs: dockerd, once
	// started, takes its share of the emulated CPU.
	script := initScript
	for _, r := range known {
		// The environment the daemon gives a session of the runtime in a
		// VM (no self-update; opencode's data off the home's share).
		rt := runtimes.Known[r.Name]
		env := strings.Join(append(append([]string{"env"}, rt.Env...), rt.VMEnv...), " ")
		script += fmt.Sprintf("[ ! -e run-inits ] || init %s %s %s &\n", r.Name, env, strings.Join(r.Command, " "))
	}
	script += "wait\n" + dockerScript
	ok(t, h, "agent", "create", "dock", "--strategy", "microsandbox", "--memory-mib", "1024", "--cpus", "2", "--", "/bin/sh", "-c", script)
	workspace := filepath.Join(agentDir(t, h, "dock"), "workspace")
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("no /bin/busybox (make deps installs busybox-static)")
	}
	os.WriteFile(filepath.Join(workspace, "busybox"), bb, 0o755)
	os.WriteFile(filepath.Join(workspace, "run-inits"), nil, 0o644)
	os.WriteFile(filepath.Join(workspace, "flood-console"), nil, 0o644)

	check := func(what, out, image string) {
		t.Helper()
		got := parseCodes(out)
		if got["user"] != "10001" || got["info"] != "ok" || got["image"] != image || got["run"] != "from-container" || got["buildx"] != "ok" || got["compose"] != "ok" {
			t.Errorf("%s: uid %q, docker info %q, image %q (want %s), run %q, buildx %q, compose %q\n%s",
				what, got["user"], got["info"], got["image"], image, got["run"], got["buildx"], got["compose"], out)
		}
	}
	// Each run's time is logged: this test is the suite's longest (about
	// 320 s of its 950 under TCG here).
	timed := func(what, id string) (string, string) {
		t.Helper()
		start := time.Now()
		id, out := startAndWaitWithin(t, h, "dock", id, 10*time.Minute)
		t.Logf("%s: %v", what, time.Since(start).Round(time.Second))
		return id, out
	}
	id, out := timed("first run", "")
	check("first run", out, "absent")
	got := parseCodes(out)
	for _, r := range known {
		if got["init-"+r.Name] != "ok" {
			t.Errorf("the image's %s at %s did not answer initialize: %q", r.Name, r.Command[0], got["init-"+r.Name])
		}
	}
	if got["console"] != "flooded" {
		t.Errorf("the container did not write the console: %q", got["console"])
	}
	checkConsoleBounded(t, h, id)
	os.Remove(filepath.Join(workspace, "run-inits"))
	os.Remove(filepath.Join(workspace, "flood-console"))

	_, out = timed("resumed", id)
	check("resumed", out, "kept")

	// More memory: a new VM, a new docker disk.
	ok(t, h, "agent", "edit", "dock", "--memory-mib", "1152")
	_, out = timed("after a rebuild", id)
	check("after a rebuild", out, "absent")
}
