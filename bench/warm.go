package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

// warmStartMeasurement is the table's measurement of warm starts.
const warmStartMeasurement = "start -> first output byte, warm boundary (admin API)"

// benchWarmHost times host sessions that claim a warm boundary, to the
// first output byte, and `agentconnect exec /bin/true` through one against
// a bare fork+exec.
func benchWarmHost(ctx context.Context, d *daemon, c counts, rep *report) error {
	n := max(c.Starts/4, 5)
	lat, claimed, err := warmStarts(ctx, d, "bench-warm-host", "host", "", n)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("n=%d, %d of them claimed a warm boundary; /bin/echo x; the cold start is the first table's", len(lat), claimed)
	rep.add(warmStartMeasurement, "host p50", lat.percentile(50), "ms", 10, ref)
	rep.add(warmStartMeasurement, "host p99", lat.percentile(99), "ms", 0, "")

	var bare, viaExec samples
	for i := 0; i < execWarmup+c.Execs; i++ {
		if err := waitWarmReady(ctx, d, "bench-warm-host"); err != nil {
			return err
		}
		t0 := time.Now()
		if err := exec.CommandContext(ctx, "/bin/true").Run(); err != nil {
			return err
		}
		tb := time.Since(t0)
		t0 = time.Now()
		if err := d.runCLI(ctx, "exec", "bench-warm-host", "--", "/bin/true"); err != nil {
			return err
		}
		if i >= execWarmup {
			bare.add(tb)
			viaExec.add(time.Since(t0))
		}
	}
	const m = "exec /bin/true (host), warm boundary"
	rep.add(m, "agentconnect exec", viaExec.median(), "ms", 0, fmt.Sprintf("median of %d; the CLI process, the admin calls (start, attach, wait, remove) and the warm shim's exec", len(viaExec)))
	rep.add(m, "bare fork+exec (Go)", bare.median(), "ms", 0, fmt.Sprintf("median of %d, interleaved", len(bare)))
	rep.add(m, "ratio exec / bare", viaExec.median()/bare.median(), "x", 6, "")
	return deleteAgent(ctx, d, "bench-warm-host")
}

// benchWarmSrt times srt sessions that claim a warm sandbox, to the first
// output byte.
func benchWarmSrt(ctx context.Context, d *daemon, c counts, rep *report) error {
	if d.srtUnavailable != "" {
		return fmt.Errorf("skipped: %s", d.srtUnavailable)
	}
	lat, claimed, err := warmStarts(ctx, d, "bench-warm-srt", "srt", "", c.SrtExecs)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("n=%d, %d of them claimed a warm sandbox; /bin/echo x", len(lat), claimed)
	rep.add(warmStartMeasurement, "srt p50", lat.percentile(50), "ms", 10, ref)
	rep.add(warmStartMeasurement, "srt p99", lat.percentile(99), "ms", 0, "")
	if err := deleteAgent(ctx, d, "bench-warm-srt"); err != nil {
		return err
	}
	// A claim checks the workspace for repositories made since the build:
	// the same in a large one.
	ws, dirs, err := largeWorkspace()
	if err != nil {
		return err
	}
	defer os.RemoveAll(ws)
	lat, claimed, err = warmStarts(ctx, d, "bench-warm-srt-large", "srt", ws, c.SrtExecs)
	if err != nil {
		return err
	}
	ref = fmt.Sprintf("n=%d, %d of them claimed a warm sandbox; a shared workspace of %d directories, three levels deep (as deep as the scan for repositories goes)", len(lat), claimed, dirs)
	rep.add(warmStartMeasurement, "srt p50, large workspace", lat.percentile(50), "ms", 0, ref)
	return deleteAgent(ctx, d, "bench-warm-srt-large")
}

// largeWorkspace makes a directory of 17 directories of 17 of 17, and
// returns it and how many directories it holds.
func largeWorkspace() (string, int, error) {
	ws, err := os.MkdirTemp("", "agentconnect-bench-workspace-")
	if err != nil {
		return "", 0, err
	}
	for i := range 17 {
		for j := range 17 {
			for k := range 17 {
				if err := os.MkdirAll(filepath.Join(ws, fmt.Sprint("d", i), fmt.Sprint("d", j), fmt.Sprint("d", k)), 0o755); err != nil {
					os.RemoveAll(ws)
					return "", 0, err
				}
			}
		}
	}
	return ws, 1 + 17 + 17*17 + 17*17*17, nil
}

// benchWarmVM times microsandbox sessions that claim a warm VM (booted,
// its guest set up), to the first output byte.
func benchWarmVM(ctx context.Context, d *daemon, c counts, rep *report) error {
	if d.vmUnavailable != "" {
		rep.note(warmStartMeasurement, "microsandbox p50", "unavailable: "+d.vmUnavailable)
		return nil
	}
	lat, claimed, err := warmStarts(ctx, d, "bench-warm-vm", "microsandbox", "", c.VMStarts)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("n=%d, %d of them claimed a warm VM (TCG, serial, 1 CPU, 512 MiB); /bin/echo x; the cold start is the microsandbox table's", len(lat), claimed)
	rep.add(warmStartMeasurement, "microsandbox p50", lat.percentile(50), "ms", 150, ref)
	rep.add(warmStartMeasurement, "microsandbox p99", lat.percentile(99), "ms", 0, "")
	return deleteAgent(ctx, d, "bench-warm-vm")
}

// warmStarts creates an agent of strategy with one warm boundary (and
// sharedWorkspace, if not "") and times n starts, each once a warm boundary
// is ready; it counts the starts whose shim says it claimed one.
func warmStarts(ctx context.Context, d *daemon, name, strategy, sharedWorkspace string, n int) (samples, int, error) {
	a, err := d.dialAdmin()
	if err != nil {
		return nil, 0, err
	}
	defer a.Close()
	if _, err := a.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: &adminv1.Agent{
		Name: name, Strategy: strategy, Command: echoCommand, Warm: 1, SharedWorkspace: sharedWorkspace,
	}}); err != nil {
		return nil, 0, fmt.Errorf("create agent %s: %w", name, err)
	}
	var lat samples
	claimed := 0
	for i := 0; i < n; i++ {
		if err := waitWarmReady(ctx, d, name); err != nil {
			return nil, 0, err
		}
		took, s, err := firstByte(ctx, a, name)
		if s != nil {
			if log, _ := os.ReadFile(filepath.Join(d.home, "sessions", s.Id, "shim.log")); strings.Contains(string(log), "warm boundary claimed") {
				claimed++
			}
			if _, rmErr := a.RemoveSession(context.WithoutCancel(ctx), &adminv1.RemoveSessionRequest{Id: s.Id, Force: true}); rmErr != nil && err == nil {
				err = fmt.Errorf("remove session %s: %w", s.Id, rmErr)
			}
		}
		if err != nil {
			return nil, 0, fmt.Errorf("start %d: %w", i+1, err)
		}
		lat.add(took)
	}
	return lat, claimed, nil
}

// waitWarmReady waits until the agent has a warm boundary ready.
func waitWarmReady(ctx context.Context, d *daemon, name string) error {
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	deadline := time.Now().Add(2 * time.Minute) // a VM boots in it (the shim's bootTimeout)
	for {
		ag, err := a.GetAgent(ctx, &adminv1.GetAgentRequest{Name: name})
		if err != nil {
			return fmt.Errorf("agent %s: %w", name, err)
		}
		if ag.WarmReady > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent %s: no warm boundary ready within 2 min (see the daemon log)", name)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func deleteAgent(ctx context.Context, d *daemon, name string) error {
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	_, err = a.DeleteAgent(ctx, &adminv1.DeleteAgentRequest{Name: name})
	return err
}
