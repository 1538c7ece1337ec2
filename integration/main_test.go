// Package integration drives the built agentconnect binaries end to end:
// a real daemon, real shims, real processes and cgroups.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
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

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/reaper"
)

// binDir holds agentconnect and its two shims: $AGENTCONNECT_BIN, or a
// fresh build.
var binDir string

const reapedEnv = "AGENTCONNECT_TEST_REAPED"

// TestMain runs the tests under a child subreaper that reaps: this
// machine's PID 1 does not, and shims are reparented to the nearest
// subreaper, so without one every ended shim would stay a zombie.
func TestMain(m *testing.M) {
	if os.Getenv(reapedEnv) == "" {
		code, err := reaper.Reexec(reapedEnv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "integration:", err)
			os.Exit(1)
		}
		os.Exit(code)
	}
	dir, cleanup, err := binaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	cleanup()
	if reachable.dir != "" {
		os.RemoveAll(reachable.dir)
	}
	os.Exit(code)
}

func binaries() (string, func(), error) {
	if dir := os.Getenv("AGENTCONNECT_BIN"); dir != "" {
		return dir, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "agentconnect-bin-")
	if err != nil {
		return "", nil, err
	}
	// World-readable, so tests that run the daemon as another user can.
	os.Chmod(dir, 0o755)
	cmd := exec.Command("go", "build", "-o", dir, "../cmd/agentconnect", "../cmd/agentconnect-shim", "../cmd/agentconnect-shim-vm", "../cmd/agentconnect-vmimage", "../cmd/agentconnect-inject")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build binaries: %w", err)
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

func agentconnect() string { return filepath.Join(binDir, "agentconnect") }

// reachable is a copy of agentconnect and its shims that every user
// can run, made on first use by agentconnectFor and removed by TestMain.
var reachable struct {
	once sync.Once
	dir  string
	err  error
}

// agentconnectFor is the agentconnect binary to run as cred: agentconnect(),
// or for another user a copy beside a copy of the shim in a directory every
// user can reach, since binDir may be where only root can go (a checkout in
// /root).
func agentconnectFor(t testing.TB, cred *syscall.Credential) string {
	t.Helper()
	if cred == nil || cred.Uid == 0 {
		return agentconnect()
	}
	reachable.once.Do(func() { reachable.dir, reachable.err = copyBinaries(binDir) })
	if reachable.err != nil {
		t.Fatalf("copy the binaries for uid %d: %v", cred.Uid, reachable.err)
	}
	return filepath.Join(reachable.dir, "agentconnect")
}

// copyBinaries copies agentconnect and its shims from dir into a new
// world-readable directory.
func copyBinaries(dir string) (string, error) {
	to, err := os.MkdirTemp("", "agentconnect-bin-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(to, 0o755); err != nil {
		os.RemoveAll(to)
		return "", err
	}
	for _, name := range []string{"agentconnect", "agentconnect-shim", "agentconnect-shim-vm", "agentconnect-vmimage", "agentconnect-inject"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			err = os.WriteFile(filepath.Join(to, name), b, 0o755)
		}
		if err != nil {
			os.RemoveAll(to)
			return "", err
		}
	}
	return to, nil
}

// result is one CLI run.
type result struct {
	stdout, stderr string
	code           int
}

// run runs the CLI against home with a timeout and returns what it did.
func run(t testing.TB, home string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentconnect(), append([]string{"--home", home}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("agentconnect %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// ok runs the CLI and fails the test unless it exits 0.
func ok(t testing.TB, home string, args ...string) string {
	t.Helper()
	r := run(t, home, "", args...)
	if r.code != 0 {
		t.Fatalf("agentconnect %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// okJSON runs the CLI with --json and decodes its output into v.
func okJSON(t testing.TB, home string, v any, args ...string) {
	t.Helper()
	out := ok(t, home, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("agentconnect %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// session is the part of `session show --json` the tests read.
type session struct {
	ID          string `json:"id"`
	Agent       string `json:"agent"`
	Strategy    string `json:"strategy"`
	State       string `json:"state"`
	PID         int    `json:"pid"`
	ShimPID     int    `json:"shimPid"`
	ExitCode    int    `json:"exitCode"`
	Reason      string `json:"reason"`
	Run         int    `json:"run"`
	OutputBytes int64  `json:"outputBytes"`
	Cgroup      string `json:"cgroup"`
	Limits      string `json:"limits"`
}

func show(t testing.TB, home, id string) session {
	t.Helper()
	var s session
	okJSON(t, home, &s, "session", "show", id)
	return s
}

// daemon is a foreground `agentconnect run` started by a test.
type daemon struct {
	t    testing.TB
	home string
	args []string
	bin  string              // the agentconnect binary; "" for agentconnect()
	cred *syscall.Credential // run as this user; nil for the test's
	cmd  *exec.Cmd
	log  *os.File
}

// newHome returns an empty daemon home.
func newHome(t testing.TB) string {
	t.Helper()
	return t.TempDir()
}

// startDaemon starts `agentconnect --home HOME run ARGS...` and waits until
// it answers. The test's cleanup stops it and every session it left.
func startDaemon(t testing.TB, home string, args ...string) *daemon {
	t.Helper()
	d := &daemon{t: t, home: home, args: args}
	d.start()
	t.Cleanup(d.cleanup)
	return d
}

func (d *daemon) start() {
	d.t.Helper()
	log, err := os.OpenFile(filepath.Join(d.home, "daemon.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		d.t.Fatal(err)
	}
	d.log = log
	bin := d.bin
	if bin == "" {
		bin = agentconnectFor(d.t, d.cred)
	}
	d.cmd = exec.Command(bin, append([]string{"--home", d.home, "run"}, d.args...)...)
	d.cmd.Stdout, d.cmd.Stderr = log, log
	// A file the daemon's parent leaves open, as a terminal or a CI runner
	// does: no session may inherit it (the batteries' inherited-fds).
	d.cmd.ExtraFiles = []*os.File{log}
	if d.cred != nil {
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: d.cred}
	}
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.waitReady()
}

// waitReady waits until status answers, or fails with the daemon's log.
func (d *daemon) waitReady() {
	d.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if run(d.t, d.home, "", "status").code == 0 {
			return
		}
		if d.cmd.ProcessState != nil || !procstat.Alive(d.cmd.Process.Pid, 0) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	logData, _ := os.ReadFile(filepath.Join(d.home, "daemon.log"))
	d.t.Fatalf("daemon did not answer; its log:\n%s", logData)
}

// kill9 SIGKILLs the daemon and reaps it.
func (d *daemon) kill9() {
	d.cmd.Process.Kill()
	d.cmd.Wait()
	d.log.Close()
}

// restart starts the daemon again with the same arguments.
func (d *daemon) restart() { d.start() }

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// cleanup removes every session (killing those that run) and stops the
// daemon, so no shim or runtime outlives the test.
func (d *daemon) cleanup() {
	if d.cmd.ProcessState == nil && procstat.Alive(d.cmd.Process.Pid, 0) {
		var sessions []session
		r := run(d.t, d.home, "", "session", "ls", "--json")
		if json.Unmarshal([]byte(r.stdout), &sessions) == nil {
			for _, s := range sessions {
				run(d.t, d.home, "", "session", "rm", "--force", s.ID)
			}
		}
		d.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { d.cmd.Wait(); close(done) }()
		select {
		case <-done:
			// A daemon that stops with no session left removes its cgroup.
			if left := leftovers.DaemonCgroups(d.home); len(left) > 0 {
				d.t.Errorf("the daemon stopped with no session left, and left its cgroup: %s", leftovers.Brief(left, 4))
			}
		case <-time.After(10 * time.Second):
			d.cmd.Process.Kill()
			<-done
		}
	}
	d.log.Close()
	if d.t.Failed() {
		d.logTail()
	}
}

// failedLogTail is how much of a failed test's daemon log the test's output
// keeps: its home, the log with it, goes when the test ends.
const failedLogTail = 64 << 10

// logTail puts the end of the daemon's log into the test's output.
func (d *daemon) logTail() {
	data, err := os.ReadFile(filepath.Join(d.home, "daemon.log"))
	if err != nil {
		d.t.Logf("daemon log: %v", err)
		return
	}
	if len(data) > failedLogTail {
		data = data[len(data)-failedLogTail:]
	}
	d.t.Logf("the test failed; the daemon's log (last %d bytes):\n%s", len(data), data)
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processesInGroup lists the live processes of process group pgid.
func processesInGroup(pgid int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		st, err := procstat.Read(pid)
		if err == nil && st.PGID == pgid && !st.Dead() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CI runs as root)")
	}
}

// adminClient is an admin API client of home's daemon, for what the CLI
// cannot send (a deadline of the test's, an oversized message); it is
// closed when the test ends.
func adminClient(t *testing.T, h string) adminv1.AdminClient {
	t.Helper()
	conn, err := net.Dial("unix", home.Layout{Root: h}.AdminSocket())
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpc.NewClient(conn)
	t.Cleanup(func() { c.Close() })
	return adminv1.NewAdminClient(c)
}
