package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// adminBound is how long the admin API may take to answer status; a
// slower answer is a violation.
const adminBound = 5 * time.Second

// chaos is one run: the daemon, its home on a loop filesystem, and what
// the rounds counted.
type chaos struct {
	rng  *rand.Rand // the plan; used by the round loop only
	seed uint64
	bin  string
	dir  string // the run's temporary directory
	loop *loopFS
	home string

	mu     sync.Mutex // guards the daemon fields below
	cmd    *exec.Cmd
	done   chan struct{}
	logF   *os.File
	gen    atomic.Uint64 // bumped by every SIGKILL of the daemon
	vmOK   bool          // microsandbox sessions can start here
	vmWhy  string        // why not
	round  int
	count  map[string]int
	counts sync.Mutex // guards count from the jobs' goroutines

	interrupt atomic.Bool
	counters  []*job // sessions that live through every round
	// agentTrees are the agents' directories as they were before the
	// first round.
	agentTrees map[string]map[string]string
	// cgroupRoots are the daemon's cgroup directories of this home, in
	// every hierarchy: no session's may be left at the end.
	cgroupRoots []string
}

func (c *chaos) add(what string, n int) {
	c.counts.Lock()
	c.count[what] += n
	c.counts.Unlock()
}

// setUp makes the loop filesystem, starts the daemon on it and creates the
// agents.
func (c *chaos) setUp() error {
	c.count = map[string]int{}
	dir, err := os.MkdirTemp("/var/tmp", "agentconnect-chaos-")
	if err != nil {
		return err
	}
	c.dir = dir
	if c.loop, err = makeLoopFS(dir, 384); err != nil {
		return err
	}
	c.home = filepath.Join(c.loop.mnt, "home")
	if err := os.Mkdir(c.home, 0o700); err != nil {
		return err
	}
	// microsandbox under TCG with the serial transport: this machine has no
	// usable KVM or vhost-vsock.
	config := `{"sandbox": {"microsandbox": {"accelerator": "tcg", "transport": "serial", "cpus": 1, "memoryMiB": 512}}}`
	if err := os.WriteFile(filepath.Join(c.home, "config.json"), []byte(config), 0o600); err != nil {
		return err
	}
	if err := c.startDaemon(); err != nil {
		return err
	}
	var st struct {
		Strategies []struct {
			Name      string `json:"name"`
			Available bool   `json:"available"`
			Reason    string `json:"reason"`
		} `json:"strategies"`
	}
	r := c.cli(adminBound, "status", "--json")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		return fmt.Errorf("status: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
	}
	for _, s := range st.Strategies {
		switch {
		case s.Name == "microsandbox":
			c.vmOK, c.vmWhy = s.Available, s.Reason
		case !s.Available && (s.Name == "host" || s.Name == "srt"):
			return fmt.Errorf("strategy %s is not available here: %s", s.Name, s.Reason)
		}
	}
	if c.vmOK && *flagVMEvery == 0 {
		c.vmOK, c.vmWhy = false, "-vm-every 0"
	}
	if !c.vmOK {
		fmt.Printf("chaos: no microsandbox sessions: %s\n", c.vmWhy)
	}
	for _, strategy := range c.strategies() {
		name := agentOf[strategy]
		args := []string{"agent", "create", name, "--strategy", strategy, "--warm", strconv.Itoa(*flagWarm)}
		if r := c.cli(30*time.Second, append(args, "--", "true")...); r.code != 0 {
			return fmt.Errorf("agent create %s: exit %d: %s", name, r.code, strings.TrimSpace(r.stderr))
		}
	}
	fmt.Printf("chaos: home %s on a %d MiB loop filesystem\n", c.home, c.loop.mib)
	return nil
}

// agentOf is the agent of each strategy's sessions.
var agentOf = map[string]string{"host": "chaos-host", "srt": "chaos-srt", "microsandbox": "chaos-vm"}

// strategies are those the run starts sessions in.
func (c *chaos) strategies() []string {
	if c.vmOK {
		return []string{"host", "srt", "microsandbox"}
	}
	return []string{"host", "srt"}
}

func (c *chaos) path(name string) string { return filepath.Join(c.bin, name) }

// startDaemon starts `agentconnect run` and waits until status answers.
func (c *chaos) startDaemon() error {
	log, err := os.OpenFile(filepath.Join(c.dir, "daemon.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.path("agentconnect"), "--home", c.home, "run")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start the daemon: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	c.mu.Lock()
	c.cmd, c.done, c.logF = cmd, done, log
	c.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("the daemon exited at start (%v)", cmd.ProcessState)
		default:
		}
		if r := c.cli(adminBound, "status"); r.code == 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("the daemon did not answer status within 30s of its start")
}

// killDaemon SIGKILLs the daemon and reaps it.
func (c *chaos) killDaemon() {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	c.gen.Add(1)
	cmd.Process.Kill()
	<-done
}

func (c *chaos) daemonPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	select {
	case <-c.done:
		return 0
	default:
		return c.cmd.Process.Pid
	}
}

// cliResult is one CLI run; gen tells whether a SIGKILL of the daemon
// happened while it ran.
type cliResult struct {
	stdout, stderr string
	code           int
	killed         bool // the daemon was SIGKILLed during the call
}

// unreachable: the call did not reach a daemon, or lost it midway.
func (r cliResult) unreachable() bool {
	return r.killed || strings.Contains(r.stderr, "no daemon is answering") || strings.Contains(r.stderr, "connection reset") ||
		strings.Contains(r.stderr, "ttrpc: closed") || strings.Contains(r.stderr, "broken pipe") || strings.Contains(r.stderr, "EOF")
}

func (c *chaos) cli(timeout time.Duration, args ...string) cliResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	gen := c.gen.Load()
	cmd := exec.CommandContext(ctx, c.path("agentconnect"), append([]string{"--home", c.home}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	// Its own process group: a ^C at the terminal is chaos's to handle
	// (the round ends, then everything is cleaned up), not a failed call.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Run()
	r := cliResult{stdout: out.String(), stderr: errOut.String(), killed: c.gen.Load() != gen}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
		if ctx.Err() != nil {
			r.stderr += fmt.Sprintf(" (killed after %v)", timeout)
		}
	case err != nil:
		r.code, r.stderr = -1, err.Error()
	}
	return r
}

// retry runs an idempotent CLI command until it reaches a daemon that
// answers, for up to a minute: a supervisor SIGKILL may land on it.
func (c *chaos) retry(args ...string) cliResult {
	deadline := time.Now().Add(time.Minute)
	for {
		r := c.cli(30*time.Second, args...)
		if r.code == 0 || !r.unreachable() || time.Now().After(deadline) {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// daemonLogTail is the end of the daemon's log, for a report.
func (c *chaos) daemonLogTail(lines int) string {
	data, err := os.ReadFile(filepath.Join(c.dir, "daemon.log"))
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// tearDown removes every session through the daemon, stops it, unmounts
// the loop filesystem and removes the run's directory. check: report what
// was left.
func (c *chaos) tearDown(check bool) string {
	var problems []string
	if c.daemonPID() == 0 && c.home != "" && c.cmd != nil {
		if err := c.startDaemon(); err != nil {
			problems = append(problems, "start the daemon again to clean up: "+err.Error())
		}
	}
	if pid := c.daemonPID(); pid != 0 {
		var sessions []struct {
			ID string `json:"id"`
		}
		r := c.retry("session", "ls", "--json")
		json.Unmarshal([]byte(r.stdout), &sessions)
		for _, s := range sessions {
			if r := c.retry("session", "rm", "--force", s.ID); r.code != 0 {
				problems = append(problems, fmt.Sprintf("session rm --force %s: %s", s.ID, strings.TrimSpace(r.stderr)))
			}
		}
		c.mu.Lock()
		cmd, done := c.cmd, c.done
		c.mu.Unlock()
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			problems = append(problems, "the daemon did not stop within 15s of SIGTERM; killed")
			cmd.Process.Kill()
			<-done
		}
		if check {
			if left := c.leftProcesses(nil, 10*time.Second); left != "" {
				problems = append(problems, "after the last session was removed and the daemon stopped: "+left)
			}
			var cgroups []string
			for _, root := range c.cgroupRoots {
				entries, _ := os.ReadDir(root)
				for _, e := range entries {
					if e.IsDir() {
						cgroups = append(cgroups, filepath.Join(root, e.Name()))
					}
				}
			}
			if len(cgroups) > 0 {
				problems = append(problems, "session cgroups left after the last session was removed: "+leftovers.Brief(cgroups, 4))
			}
			if left := leftovers.DaemonCgroups(c.home); len(left) > 0 {
				problems = append(problems, "the daemon stopped with no session left, and left its cgroup: "+leftovers.Brief(left, 4))
			}
		}
	}
	if c.loop != nil {
		if err := c.loop.remove(); err != nil {
			problems = append(problems, err.Error())
		}
	}
	if c.dir != "" && len(problems) == 0 {
		os.RemoveAll(c.dir)
	} else if c.dir != "" {
		problems = append(problems, "kept "+c.dir)
	}
	return strings.Join(problems, "; ")
}
