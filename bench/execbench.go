package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

const execWarmup = 3

// benchExec times `agentconnect exec AGENT -- /bin/true` (host) against a
// bare fork+exec of /bin/true, and `agentconnect status` as the cost of one
// CLI process and one admin call.
func benchExec(ctx context.Context, d *daemon, c counts, rep *report) error {
	bare := func() error { return exec.Command("/bin/true").Run() }
	viaExec := func() error { return d.runCLI(ctx, "exec", benchAgent, "--", "/bin/true") }
	status := func() error { return d.runCLI(ctx, "status") }
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	viaAPI := func() error { return startWaitRemove(ctx, a, benchAgent, []string{"/bin/true"}) }

	var bareT, execT, statusT, apiT samples
	for _, t := range []struct {
		fn  func() error
		out *samples
	}{{bare, &bareT}, {viaExec, &execT}, {status, &statusT}, {viaAPI, &apiT}} {
		for i := 0; i < execWarmup+c.Execs; i++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t0 := time.Now()
			if err := t.fn(); err != nil {
				return err
			}
			if i >= execWarmup {
				t.out.add(time.Since(t0))
			}
		}
	}
	const m = "exec /bin/true (host)"
	n := fmt.Sprintf("median of %d", len(execT))
	rep.add(m, "agentconnect exec", execT.median(), "ms", 0, n+"; containerd `ctr run --rm`: 260 ms")
	rep.add(m, "bare fork+exec (Go)", bareT.median(), "ms", 0, n)
	rep.add(m, "ratio exec / bare", execT.median()/bareT.median(), "x", 6, "")
	rep.add(m, "agentconnect status", statusT.median(), "ms", 0, n+"; one CLI process + one admin call")
	rep.add(m, "agentconnect exec p99", execT.percentile(99), "ms", 0, "")
	rep.add(m, "admin API start+wait+rm", apiT.median(), "ms", 0, n+"; what exec asks of the daemon, without the CLI")
	return nil
}

// startWaitRemove runs command in a session of agent through the admin API,
// waits for its end and removes it.
func startWaitRemove(ctx context.Context, a *admin, agent string, command []string) error {
	s, err := a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: agent, Command: command})
	if err != nil {
		return fmt.Errorf("start session: %w", err)
	}
	end, err := a.WaitSession(ctx, &adminv1.WaitSessionRequest{Id: s.Id})
	if err != nil {
		return fmt.Errorf("wait session: %w", err)
	}
	if end.State != "exited" || end.ExitCode != 0 {
		return fmt.Errorf("session %s ended %s, exit code %d: %s", s.Id, end.State, end.ExitCode, end.Reason)
	}
	if _, err := a.RemoveSession(ctx, &adminv1.RemoveSessionRequest{Id: s.Id}); err != nil {
		return fmt.Errorf("remove session: %w", err)
	}
	return nil
}

// runCLI runs the CLI and fails unless it exits 0.
func (d *daemon) runCLI(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, d.path("agentconnect"), append([]string{"--home", d.home}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("agentconnect %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
