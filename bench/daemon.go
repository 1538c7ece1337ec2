package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// benchAgent is the agent every measurement uses: host strategy, a runtime
// that prints one line. Measurements that need another command pass it with
// the session start.
const benchAgent = "bench"

var (
	echoCommand  = []string{"/bin/echo", "x"}
	sleepCommand = []string{"/bin/sleep", "600"}
)

// daemon is the `agentconnect run` the bench drives.
type daemon struct {
	bin  string
	home string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when cmd has been waited for
	// ready: the daemon answered once, so there may be sessions to clean up.
	ready bool

	// srtUnavailable says why the srt measurements cannot run, or is "".
	srtUnavailable string
	// inject are the loopback hosts of the injection measurement.
	inject *injectHosts
	chat   *chatAPI // the chat measurement's fake model API; nil if it did not start
	// srtAgentDir is the srt agent's directory, srtBaseline what it held
	// before its first session.
	srtAgentDir string
	srtBaseline map[string]string

	// vmUnavailable says why the microsandbox measurements cannot run, or
	// is "".
	vmUnavailable string
}

func (d *daemon) path(name string) string { return filepath.Join(d.bin, name) }
func (d *daemon) logPath() string         { return filepath.Join(d.home, "daemon.log") }
func (d *daemon) socket() string          { return home.Layout{Root: d.home}.AdminSocket() }

// start execs the daemon and returns the instant just before the exec. It
// runs in its own process group, so a ^C at the terminal reaches the bench
// (which cleans up through it) rather than the daemon.
func (d *daemon) start() (time.Time, error) {
	log, err := os.OpenFile(d.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return time.Time{}, err
	}
	d.log = log
	d.cmd = exec.Command(d.path("agentconnect"), "--home", d.home, "run")
	d.cmd.Stdout, d.cmd.Stderr = log, log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := d.cmd.Start(); err != nil {
		log.Close()
		return t0, fmt.Errorf("start the daemon: %w", err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		close(done)
	}(d.cmd, d.done)
	return t0, nil
}

func (d *daemon) exited() bool {
	if d.done == nil {
		return true
	}
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// waitReady polls Status on the admin API until it answers.
func (d *daemon) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if d.exited() {
			return fmt.Errorf("the daemon exited (%v)", d.cmd.ProcessState)
		}
		if a, err := d.dialAdmin(); err == nil {
			_, err = a.Status(ctx, &adminv1.StatusRequest{})
			a.Close()
			if err == nil {
				d.ready = true
				return nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("the daemon did not answer within %v", timeout)
}

// kill9 SIGKILLs the daemon and reaps it.
func (d *daemon) kill9() {
	if d.exited() {
		return
	}
	d.cmd.Process.Kill()
	<-d.done
	d.log.Close()
}

// stop removes every session with `session rm --force`, SIGTERMs the daemon
// and waits for it. It returns what it could not clean up, if anything.
func (d *daemon) stop() string {
	var problems []string
	if d.exited() && d.ready {
		// A measurement left the daemon down: start it again to remove
		// the sessions through it.
		if _, err := d.start(); err == nil {
			if err := d.waitReady(context.Background(), 20*time.Second); err != nil {
				problems = append(problems, "restart the daemon for cleanup: "+err.Error())
			}
		}
	}
	if !d.exited() {
		out, _, code, err := d.cli(context.Background(), "session", "ls", "--json")
		var sessions []struct {
			ID string `json:"id"`
		}
		if err != nil || code != 0 || json.Unmarshal([]byte(out), &sessions) != nil {
			problems = append(problems, fmt.Sprintf("session ls failed (exit %d, %v)", code, err))
		}
		ids := make(chan string)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for id := range ids {
					_, stderr, code, err := d.cli(context.Background(), "session", "rm", "--force", id)
					if err != nil || code != 0 {
						mu.Lock()
						problems = append(problems, fmt.Sprintf("session rm --force %s: exit %d %v %s", id, code, err, strings.TrimSpace(stderr)))
						mu.Unlock()
					}
				}
			}()
		}
		for _, s := range sessions {
			ids <- s.ID
		}
		close(ids)
		wg.Wait()
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
			if left := leftovers.DaemonCgroups(d.home); len(left) > 0 {
				problems = append(problems, "the daemon stopped with no session left, and left its cgroup: "+leftovers.Brief(left, 4))
			}
		case <-time.After(10 * time.Second):
			problems = append(problems, "the daemon did not stop within 10s of SIGTERM; killed")
			d.cmd.Process.Kill()
			<-d.done
		}
		d.log.Close()
	}
	// A removed session's shim exits on its own moments later.
	var pids []int
	for deadline := time.Now().Add(shimExitGrace); ; time.Sleep(20 * time.Millisecond) {
		if pids = shimsOf(d.home); len(pids) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(pids) > 0 {
		problems = append(problems, fmt.Sprintf("shims still running %v after cleanup: %v", shimExitGrace, pids))
	}
	return strings.Join(problems, "; ")
}

// shimExitGrace is how long the shims of removed sessions get to exit.
const shimExitGrace = 5 * time.Second

// shimsOf lists the live agentconnect-shim processes whose command line
// names this home.
func shimsOf(homeDir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cmdline, []byte("agentconnect-shim")) || !bytes.Contains(cmdline, []byte(homeDir)) {
			continue
		}
		if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// cli runs the agentconnect CLI against the home.
func (d *daemon) cli(ctx context.Context, args ...string) (stdout, stderr string, code int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.path("agentconnect"), append([]string{"--home", d.home}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errOut.String(), ee.ExitCode(), nil
	}
	return out.String(), errOut.String(), 0, err
}

// admin is a connection to the admin API.
type admin struct {
	adminv1.AdminClient
	client *ttrpc.Client
}

func (a *admin) Close() { a.client.Close() }

func (d *daemon) dialAdmin() (*admin, error) {
	conn, err := net.DialTimeout("unix", d.socket(), 2*time.Second)
	if err != nil {
		return nil, err
	}
	c := ttrpc.NewClient(conn)
	return &admin{AdminClient: adminv1.NewAdminClient(c), client: c}, nil
}

func (d *daemon) createAgent(ctx context.Context) error {
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	_, err = a.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: &adminv1.Agent{
		Name: benchAgent, Strategy: "host", Command: echoCommand,
	}})
	return err
}

// startSessions starts n sessions of the bench agent running command, with
// a few in flight at once, and returns them.
func startSessions(ctx context.Context, a *admin, n int, command []string) ([]*adminv1.Session, error) {
	return startAgentSessions(ctx, a, benchAgent, n, command, 4)
}

// startAgentSessions starts n sessions of agent running command, width at
// once, and returns those that started.
func startAgentSessions(ctx context.Context, a *admin, agent string, n int, command []string, width int) ([]*adminv1.Session, error) {
	out := make([]*adminv1.Session, n)
	jobs := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for w := 0; w < width; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				s, err := a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: agent, Command: command})
				if err != nil {
					errs <- fmt.Errorf("start session %d of %d: %w", i+1, n, err)
					continue
				}
				out[i] = s
			}
		}()
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	close(errs)
	var started []*adminv1.Session
	for _, s := range out {
		if s != nil {
			started = append(started, s)
		}
	}
	if err := <-errs; err != nil {
		return started, err
	}
	return started, ctx.Err()
}

// removeSessions force-removes sessions through the admin API, a few at once.
func removeSessions(ctx context.Context, a *admin, sessions []*adminv1.Session) error {
	jobs := make(chan string)
	errs := make(chan error, len(sessions))
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range jobs {
				if _, err := a.RemoveSession(context.WithoutCancel(ctx), &adminv1.RemoveSessionRequest{Id: id, Force: true}); err != nil {
					errs <- fmt.Errorf("remove session %s: %w", id, err)
				}
			}
		}()
	}
	for _, s := range sessions {
		jobs <- s.Id
	}
	close(jobs)
	wg.Wait()
	close(errs)
	return <-errs
}

// logSize is the daemon log's current size: where the next run's lines
// start.
func (d *daemon) logSize() int64 {
	fi, err := os.Stat(d.logPath())
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logFrom returns the daemon log from offset on.
func (d *daemon) logFrom(offset int64) string {
	f, err := os.Open(d.logPath())
	if err != nil {
		return ""
	}
	defer f.Close()
	f.Seek(offset, io.SeekStart)
	data, _ := io.ReadAll(f)
	return string(data)
}

func (d *daemon) logTail(n int64) string {
	return d.logFrom(max(0, d.logSize()-n))
}

var (
	logTimeRE = regexp.MustCompile(`^time="[^"]*" `)
	logIDsRE  = regexp.MustCompile(`\b(session|pid|shim|agent)=\S+`)
)

// checkLog returns the daemon's warning- and error-level lines and panics,
// each distinct line once with how many times it occurred.
func (d *daemon) checkLog() []string {
	counts := map[string]int{}
	var order []string
	for _, line := range strings.Split(d.logFrom(0), "\n") {
		if !strings.Contains(line, "level=warn") && !strings.Contains(line, "level=error") && !strings.Contains(line, "level=fatal") &&
			!strings.HasPrefix(line, "panic:") && !strings.HasPrefix(line, "fatal error:") {
			continue
		}
		// Drop what differs between occurrences: time, session ids, pids.
		key := logTimeRE.ReplaceAllString(line, "")
		key = logIDsRE.ReplaceAllString(key, "$1=…")
		if counts[key] == 0 {
			order = append(order, key)
		}
		counts[key]++
	}
	var out []string
	for _, k := range order {
		out = append(out, fmt.Sprintf("%dx %s", counts[k], k))
	}
	return out
}
