package main

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

// readoptDeadline bounds how long a restarted daemon is given to report every
// session running again.
const readoptDeadline = 30 * time.Second

// benchRestart SIGKILLs the daemon while sessions run `sleep 600`, starts it
// again, and times from the exec to Status answering and to every session
// reported running with the same runtime and shim pids (both through the
// admin API), next to the daemon's own "sessions recovered ... took=".
func benchRestart(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m0 = "supervisor restart, no sessions"
	base, err := restartOnce(ctx, d, nil)
	if err != nil {
		return fmt.Errorf("restart with no sessions: %w", err)
	}
	rep.add(m0, "exec -> status answers", ms(base.status), "ms", 0, "includes the startup probes of every strategy")

	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	sessions, err := startSessions(ctx, a, c.RestartSessions, sleepCommand)
	a.Close()
	defer func() {
		if a, err := d.dialAdmin(); err == nil {
			if err := removeSessions(ctx, a, sessions); err != nil {
				rep.Errors = append(rep.Errors, "supervisor restart: "+err.Error())
			}
			a.Close()
		}
	}()
	if err != nil {
		return err
	}
	// Start reports the session running; take the pids as the daemon lists them.
	a, err = d.dialAdmin()
	if err != nil {
		return err
	}
	list, err := a.ListSessions(ctx, &adminv1.ListSessionsRequest{Agent: benchAgent})
	a.Close()
	if err != nil {
		return err
	}
	want := map[string]pids{}
	for _, s := range list.Sessions {
		if s.State != "running" {
			return fmt.Errorf("session %s is %s before the restart (%s)", s.Id, s.State, s.Reason)
		}
		want[s.Id] = pids{s.Pid, s.ShimPid}
	}
	if len(want) != len(sessions) {
		return fmt.Errorf("%d sessions started, %d listed", len(sessions), len(want))
	}

	m := fmt.Sprintf("supervisor restart, %d live sessions", len(want))
	for round := 1; round <= c.Restarts; round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := restartOnce(ctx, d, want)
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		ref := ""
		if round == 1 {
			ref = "containerd 1.6: 166 ms with 50 shims"
		}
		rep.add(m, fmt.Sprintf("#%d exec -> status answers", round), ms(r.status), "ms", 0, "")
		rep.add(m, fmt.Sprintf("#%d exec -> all running, same pids", round), ms(r.all), "ms", 1000, ref)
		if r.took >= 0 {
			rep.add(m, fmt.Sprintf("#%d daemon log took=", round), ms(r.took), "ms", 0, r.recovered)
		} else {
			rep.note(m, fmt.Sprintf("#%d daemon log took=", round), "no \"sessions recovered\" line in the daemon log")
		}
	}
	return nil
}

type pids struct{ runtime, shim uint32 }

type restartResult struct {
	status, all, took time.Duration // took < 0: not in the log
	recovered         string        // the daemon's log line
}

// The fields of the daemon's "sessions recovered" line, text or JSON.
var (
	tookRE     = regexp.MustCompile(`"?took"?[=:]"?([0-9.]+[a-zµ]+)`)
	sessionsRE = regexp.MustCompile(`"?sessions"?[=:]([0-9]+)`)
	adoptedRE  = regexp.MustCompile(`"?adopted"?[=:]([0-9]+)`)
)

// restartOnce SIGKILLs the daemon, starts it again and polls the admin API
// until Status answers and (when want is not empty) every wanted session is
// listed running with its pids.
func restartOnce(ctx context.Context, d *daemon, want map[string]pids) (restartResult, error) {
	r := restartResult{took: -1}
	d.kill9()
	off := d.logSize()
	t0, err := d.start()
	if err != nil {
		return r, err
	}
	var a *admin
	defer func() {
		if a != nil {
			a.Close()
		}
	}()
	var missing string
	for deadline := t0.Add(readoptDeadline); ; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			if r.status == 0 {
				return r, fmt.Errorf("the daemon did not answer within %v; its log:\n%s", readoptDeadline, d.logFrom(off))
			}
			return r, fmt.Errorf("not every session was running again with the same pids within %v: %s", readoptDeadline, missing)
		}
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
		if d.exited() {
			return r, fmt.Errorf("the daemon exited (%v); its log:\n%s", d.cmd.ProcessState, d.logFrom(off))
		}
		if a == nil {
			if a, err = d.dialAdmin(); err != nil {
				a = nil
				continue
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if r.status == 0 {
			_, err := a.Status(cctx, &adminv1.StatusRequest{})
			if err != nil {
				cancel()
				a.Close()
				a = nil
				continue
			}
			r.status = time.Since(t0)
			if len(want) == 0 {
				cancel()
				break
			}
		}
		list, err := a.ListSessions(cctx, &adminv1.ListSessionsRequest{Agent: benchAgent})
		cancel()
		if err != nil {
			missing = err.Error()
			continue
		}
		if missing = compareSessions(want, list.Sessions); missing == "" {
			r.all = time.Since(t0)
			break
		}
	}
	// The daemon logs the recovery before it serves; allow for buffering.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, line := range strings.Split(d.logFrom(off), "\n") {
			if !strings.Contains(line, "sessions recovered") {
				continue
			}
			var fields []string
			for k, re := range map[string]*regexp.Regexp{"sessions": sessionsRE, "adopted": adoptedRE} {
				if sm := re.FindStringSubmatch(line); sm != nil {
					fields = append(fields, k+"="+sm[1])
				}
			}
			sort.Strings(fields)
			r.recovered = "daemon log: " + strings.Join(fields, " ")
			if sm := tookRE.FindStringSubmatch(line); sm != nil {
				if v, err := time.ParseDuration(sm[1]); err == nil {
					r.took = v
				}
			}
			return r, nil
		}
		if len(want) == 0 {
			break // no sessions: nothing to recover, no line
		}
	}
	return r, nil
}

// compareSessions returns what differs from want, or "".
func compareSessions(want map[string]pids, got []*adminv1.Session) string {
	seen := 0
	var bad []string
	for _, s := range got {
		w, ok := want[s.Id]
		if !ok {
			continue
		}
		seen++
		if s.State != "running" || s.Pid != w.runtime || s.ShimPid != w.shim {
			bad = append(bad, fmt.Sprintf("%s: %s pid %d shim %d (want running pid %d shim %d) %s", s.Id, s.State, s.Pid, s.ShimPid, w.runtime, w.shim, s.Reason))
		}
	}
	if seen != len(want) {
		bad = append(bad, fmt.Sprintf("%d of %d sessions listed", seen, len(want)))
	}
	if len(bad) > 3 {
		bad = append(bad[:3], fmt.Sprintf("and %d more", len(bad)-3))
	}
	return strings.Join(bad, "; ")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
