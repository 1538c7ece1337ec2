// Package reaper runs a command under this process made a child subreaper
// that reaps every orphan. On a machine whose PID 1 does not reap (this one),
// the shims a daemon leaves are reparented to the nearest subreaper; without
// one, each ended shim would stay a zombie, and a leak check could not tell.
package reaper

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// drainFor is how long Run keeps reaping after cmd has exited: shims linger
// a few seconds after their run, and should not become init's zombies. (A
// variable for the tests.)
var drainFor = 6 * time.Second

// Run becomes a child subreaper, starts cmd, passes SIGINT and SIGTERM on to
// it, reaps every process that ends until cmd itself has (and, for a few
// seconds more, the orphans still ending), and returns cmd's exit code
// (128+N for a signal). cmd's stdio must be files (or nil): Run reaps cmd
// itself, so os/exec's copying goroutines for other readers and writers are
// never waited for.
func Run(cmd *exec.Cmd) (int, error) { return run(cmd, false) }

func run(cmd *exec.Cmd, killLeft bool) (int, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return 0, fmt.Errorf("become a child subreaper: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(signals)
	go func() {
		for sig := range signals {
			cmd.Process.Signal(sig)
		}
	}()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("wait: %w", err)
		}
		if pid != cmd.Process.Pid {
			continue // an orphan, reaped
		}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		drain(time.Now().Add(drainFor))
		if killLeft {
			killOrphans()
		}
		return code, nil
	}
}

// drain reaps the orphans that are left until none is, or the deadline.
func drain(deadline time.Time) {
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.ECHILD {
			return
		}
		if pid <= 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// killOrphans kills the orphans still alive after the drain, and what
// they leave in turn (a shim's runtime dies with it, its orphans come
// here), until none is left or a bound passes, and names them on stderr.
// A harness that failed without its cleanups (a test binary killed by
// its -timeout) would otherwise leave its daemons, shims and VMs running
// under init for good, skewing every later run on the machine.
func killOrphans() {
	deadline := time.Now().Add(drainFor)
	for time.Now().Before(deadline) {
		left := children()
		if len(left) == 0 {
			return
		}
		for _, pid := range left {
			// Still our child, unreaped: the pid cannot be another's.
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			fmt.Fprintf(os.Stderr, "reaper: killing pid %d, left running by the command: %s\n", pid,
				strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " ")))
			syscall.Kill(pid, syscall.SIGKILL)
		}
		drain(time.Now().Add(time.Second))
	}
}

// children lists this process's live children.
func children() []int {
	var pids []int
	for _, pid := range procstat.Children(os.Getpid()) {
		if procstat.Alive(pid, 0) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Reexec runs this program again, with the same arguments and env (plus
// marker=1), under Run, and returns its exit code. The child sees marker set
// and does the real work: the pattern of TestMain and the bench harness.
// Unlike Run, what the child leaves running once it has exited is killed
// (killOrphans): a harness's processes never outlive it.
func Reexec(marker string) (int, error) {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), marker+"=1")
	return run(cmd, true)
}
