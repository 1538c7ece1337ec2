package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kind is what a round does to a job's session.
type kind int

const (
	normal      kind = iota // left alone (supervisor SIGKILLs and the full disk still happen around it)
	killRuntime             // its runtime SIGKILLed: exited 137
	killShim                // its shim SIGKILLed: lost, with a reason
	stopRace                // stopped while its start is still in flight: exited 143
	counter                 // lives through every round, stopped at the end
)

func (k kind) String() string {
	return [...]string{"normal", "runtime killed", "shim killed", "stop racing start", "counter"}[k]
}

// job is one session the chaos run starts, and what it must end as.
type job struct {
	name     string // a token in its command line: chaos-rR-jJ
	strategy string
	kind     kind
	lines    int    // the lines 1..lines it prints
	delay    string // seconds between lines
	exit     int    // its exit code when left alone
	// strikeAfter is when its runtime or shim is killed after its start.
	strikeAfter time.Duration

	id       string
	startErr string // the start's error, when it failed
	ambig    bool   // a SIGKILL of the daemon took the start's answer
	landed   bool   // the kill or the stop reached it
	last     int    // a counter's lines at the last check
}

func (j *job) agent() string {
	return agentOf[j.strategy]
}

// command prints 1..lines, one line per delay seconds, then exits; a
// counter goes on until stopped. The job's name is its $0, so `session ls`
// finds it before its start has answered.
func (j *job) command() []string {
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do i=$((i+1)); echo $i; sleep %s; done; exit %d`, j.lines, j.delay, j.exit)
	if j.kind == counter {
		script = `i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done`
	}
	return []string{"sh", "-c", script, j.name}
}

func (j *job) String() string {
	s := fmt.Sprintf("%s (%s, %s", j.name, j.strategy, j.kind)
	if j.id != "" {
		s += ", session " + j.id
	}
	return s + ")"
}

// sessionView is the part of `session show --json` chaos reads.
type sessionView struct {
	ID       string   `json:"id"`
	Agent    string   `json:"agent"`
	State    string   `json:"state"`
	PID      int      `json:"pid"`
	ShimPID  int      `json:"shimPid"`
	ExitCode int      `json:"exitCode"`
	Reason   string   `json:"reason"`
	Command  []string `json:"command"`
	Cgroup   string   `json:"cgroup"`
}

func (c *chaos) show(id string) (sessionView, error) {
	var s sessionView
	r := c.retry("session", "show", id, "--json")
	if r.code != 0 {
		return s, fmt.Errorf("session show %s: exit %d: %s", id, r.code, strings.TrimSpace(r.stderr))
	}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		return s, fmt.Errorf("session show %s --json: %v", id, err)
	}
	return s, nil
}

// start starts j. A start whose answer a daemon SIGKILL took is ambiguous:
// the session may or may not exist, and the round finds it by its name.
func (c *chaos) start(j *job) {
	r := c.cli(2*time.Minute, append([]string{"session", "start", j.agent(), "--"}, j.command()...)...)
	switch {
	case r.code == 0:
		j.id = strings.TrimSpace(r.stdout)
	case r.unreachable():
		j.ambig = true
		c.add("starts whose answer a SIGKILL took", 1)
	default:
		j.startErr = strings.TrimSpace(r.stderr)
	}
}

// findByName finds the session whose command carries name, or "".
func (c *chaos) findByName(name string) (string, error) {
	r := c.retry("session", "ls", "--json")
	if r.code != 0 {
		return "", fmt.Errorf("session ls: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
	}
	var all []sessionView
	if err := json.Unmarshal([]byte(r.stdout), &all); err != nil {
		return "", fmt.Errorf("session ls --json: %v", err)
	}
	for _, s := range all {
		if len(s.Command) == 4 && s.Command[3] == name {
			return s.ID, nil
		}
	}
	return "", nil
}

// strike does j's fault to it once its session runs: SIGKILL of its
// runtime or shim, strikeAfter its start. landed says whether it reached a
// live process.
func (c *chaos) strike(j *job) error {
	time.Sleep(j.strikeAfter)
	s, err := c.show(j.id)
	if err != nil {
		return err
	}
	if s.State != "running" {
		return nil // it ended first: left alone after all
	}
	pid := s.PID
	if j.kind == killShim {
		pid = s.ShimPID
	}
	if pid <= 0 {
		return fmt.Errorf("%s: session show gives no pid to kill (%+v)", j, s)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
		j.landed = true
	}
	return nil
}

// stopRacing stops j's session as soon as `session ls` shows it, while its
// start may still be in flight.
func (c *chaos) stopRacing(j *job, startDone <-chan struct{}) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		id, err := c.findByName(j.name)
		if err != nil {
			return err
		}
		if id != "" {
			r := c.retry("session", "stop", "--timeout", "2", id)
			if r.code == 0 {
				j.landed = true
				return nil
			}
			// Stopping a session that already ended, or one whose start
			// then failed, is refused: the checks judge the session.
			return nil
		}
		select {
		case <-startDone:
			if j.id == "" {
				return nil // the start failed: nothing to stop
			}
		default:
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("%s: session ls did not show it within a minute", j)
}

// waitEnded waits until j's session is exited or lost.
func (c *chaos) waitEnded(j *job, bound time.Duration) (sessionView, error) {
	deadline := time.Now().Add(bound)
	for {
		s, err := c.show(j.id)
		if err != nil {
			return s, err
		}
		if s.State == "exited" || s.State == "lost" {
			return s, nil
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("%s is still %s %v after the round's faults (expected to end: %d lines, %ss apart)", j, s.State, bound, j.lines, j.delay)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// output is j's output as `session logs` prints it, checked to be the lines
// 1..n in order with none lost or repeated; it returns n.
func (c *chaos) output(j *job) (int, error) {
	r := c.retry("session", "logs", j.id)
	if r.code != 0 {
		return 0, fmt.Errorf("session logs %s: exit %d: %s", j.id, r.code, strings.TrimSpace(r.stderr))
	}
	return countLines(r.stdout)
}

// countLines checks that out is "1\n2\n...n\n" and returns n.
func countLines(out string) (int, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	n := 0
	for sc.Scan() {
		v, err := strconv.Atoi(sc.Text())
		if err != nil || v != n+1 {
			return n, fmt.Errorf("line %d is %q, want %d: output lost, repeated or garbled", n+1, sc.Text(), n+1)
		}
		n = v
	}
	if out != "" && !strings.HasSuffix(out, "\n") {
		return n, fmt.Errorf("the output ends in a partial line after %d lines", n)
	}
	return n, nil
}

// judge checks how j's session ended against what was done to it, in a
// round whose disk was full for a while or not.
func (c *chaos) judge(j *job, s sessionView, fullDisk bool) error {
	n, err := c.output(j)
	if err != nil {
		return fmt.Errorf("%s: %v", j, err)
	}
	full := n == j.lines
	switch {
	case j.ambig && fullDisk && n == 0 && s.State == "exited" && s.ExitCode == -1 && strings.Contains(s.Reason, "no space left on device"):
		// The next supervisor finished the start a SIGKILL took, while the
		// disk was full: it failed and said why, as a refused start does.
		return nil
	case s.State == "lost" && j.kind == killShim && j.landed:
		if s.Reason == "" {
			return fmt.Errorf("%s is lost with no reason", j)
		}
		return nil
	case s.State == "lost" && j.ambig && s.Reason != "":
		// The supervisor died while it started the session, and the CLI
		// said so: the start may end there, with its reason.
		return nil
	case s.State == "lost":
		return fmt.Errorf("%s is lost (%s), and nothing killed its shim", j, s.Reason)
	case j.kind == killRuntime && j.landed:
		if s.ExitCode != 128+int(syscall.SIGKILL) {
			return fmt.Errorf("%s exited %d after its runtime was SIGKILLed, want %d (%d of %d lines)", j, s.ExitCode, 128+int(syscall.SIGKILL), n, j.lines)
		}
		return nil
	case j.kind == killShim && j.landed:
		return fmt.Errorf("%s is %s with exit %d after its shim was SIGKILLed, want lost", j, s.State, s.ExitCode)
	case j.kind == stopRace && j.landed && n == 0 && s.ExitCode == 128+int(syscall.SIGKILL):
		// Stopped while its boundary was built (a VM booting, or an srt
		// sandbox on a loaded machine: 2.4 s seen): there was no runtime
		// to take the SIGTERM yet, and the stop's grace (2 s) ended before
		// the start did, so the runtime was killed as it began, as
		// `session stop` promises. It printed nothing.
		return nil
	case j.kind == stopRace && j.landed && !full:
		if s.ExitCode != 128+int(syscall.SIGTERM) {
			return fmt.Errorf("%s exited %d after its stop, want %d (%d of %d lines)", j, s.ExitCode, 128+int(syscall.SIGTERM), n, j.lines)
		}
		return nil
	case j.kind == stopRace && j.landed && s.ExitCode == 128+int(syscall.SIGTERM):
		return nil // stopped after its last line, before its exit
	}
	if !full || s.ExitCode != j.exit {
		return fmt.Errorf("%s exited %d with %d of %d lines, want exit %d with every line", j, s.ExitCode, n, j.lines, j.exit)
	}
	return nil
}
