package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// benchSrtMemory starts srt sessions running `sleep 600`, lets them go idle
// and reads the RSS and PSS of what each one costs: its shim (which serves
// the network policy proxy: there is no bridge process in the sandbox), any
// other process of ours in its tree, and bubblewrap's two processes (not
// ours, but there for every session). The runtime itself is left out.
func benchSrtMemory(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m = "srt session memory (sleep 600, after 2 s)"
	if d.srtUnavailable != "" {
		rep.note(m, "shim + bridge RSS mean", "unavailable: "+d.srtUnavailable)
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	sessions, err := startAgentSessions(ctx, a, srtAgent, c.SrtSessions, sleepCommand, 4)
	defer func() {
		if rmErr := removeSessions(ctx, a, sessions); rmErr != nil {
			rep.Errors = append(rep.Errors, "srt session memory: "+rmErr.Error())
		}
	}()
	if err != nil {
		return err
	}
	select {
	case <-time.After(shimIdle):
	case <-ctx.Done():
		return ctx.Err()
	}
	ids := map[string]bool{}
	for _, s := range sessions {
		ids[s.Id] = true
	}
	list, err := a.ListSessions(ctx, &adminv1.ListSessionsRequest{Agent: srtAgent})
	if err != nil {
		return err
	}
	procs := leftovers.ReadProcs()
	children := leftovers.ChildrenOf(procs)
	var shimRSS, shimPSS, oursRSS, oursPSS, bwrapRSS, bwrapPSS samples // kB, per session
	others := map[string]int{}                                         // other processes of ours, by name
	nBwrap := map[int]int{}                                            // sessions by their number of bwrap processes
	for _, s := range list.Sessions {
		if !ids[s.Id] {
			continue
		}
		if s.State != "running" || s.ShimPid == 0 {
			return fmt.Errorf("session %s: state %q, shim pid %d (%s); want a running session with a shim", s.Id, s.State, s.ShimPid, s.Reason)
		}
		shim := int(s.ShimPid)
		roll, err := readSmapsRollup(shim)
		if err != nil {
			return err
		}
		shimRSS = append(shimRSS, float64(roll["Rss"]))
		shimPSS = append(shimPSS, float64(roll["Pss"]))
		var oR, oP, bR, bP float64
		bwraps := 0
		for _, pid := range leftovers.Descendants(children, shim, int(s.Pid)) {
			p := procs[pid]
			r, err := readSmapsRollup(pid)
			if err != nil {
				return fmt.Errorf("session %s: %v: %w", s.Id, p, err)
			}
			if p.Name() == "bwrap" {
				bR, bP, bwraps = bR+float64(r["Rss"]), bP+float64(r["Pss"]), bwraps+1
			} else {
				oR, oP = oR+float64(r["Rss"]), oP+float64(r["Pss"])
				others[p.Name()]++
			}
		}
		oursRSS = append(oursRSS, float64(roll["Rss"])+oR)
		oursPSS = append(oursPSS, float64(roll["Pss"])+oP)
		bwrapRSS = append(bwrapRSS, bR)
		bwrapPSS = append(bwrapPSS, bP)
		nBwrap[bwraps]++
	}
	if len(shimRSS) != len(sessions) {
		return fmt.Errorf("%d sessions started, %d listed", len(sessions), len(shimRSS))
	}

	const mib = 1024.0
	var otherNames []string
	for name, n := range others {
		otherNames = append(otherNames, fmt.Sprintf("%s x%d", name, n))
	}
	sort.Strings(otherNames)
	otherNote := "none: the proxy runs in the shim, no bridge in the sandbox"
	if len(otherNames) > 0 {
		otherNote = "other processes of ours: " + strings.Join(otherNames, ", ")
	}
	var bwrapCounts []string
	for n, sessions := range nBwrap {
		bwrapCounts = append(bwrapCounts, fmt.Sprintf("%d sessions with %d", sessions, n))
	}
	sort.Strings(bwrapCounts)
	rep.add(m, "shim RSS mean", shimRSS.mean()/mib, "MiB", 0, fmt.Sprintf("%d sessions", len(shimRSS)))
	rep.add(m, "shim PSS mean", shimPSS.mean()/mib, "MiB", 0, "shared pages split between the live shims")
	rep.add(m, "shim + bridge RSS mean", oursRSS.mean()/mib, "MiB", 10, otherNote)
	rep.add(m, "shim + bridge RSS max", oursRSS.max()/mib, "MiB", 10, "")
	rep.add(m, "shim + bridge PSS mean", oursPSS.mean()/mib, "MiB", 0, "")
	rep.add(m, "bwrap processes RSS mean", bwrapRSS.mean()/mib, "MiB", 0, "bubblewrap's own (not ours, paid per session): "+strings.Join(bwrapCounts, ", "))
	rep.add(m, "bwrap processes PSS mean", bwrapPSS.mean()/mib, "MiB", 0, "")
	rep.add(m, "per session, all but the runtime (RSS)", (oursRSS.mean()+bwrapRSS.mean())/mib, "MiB", 0, "shim + bridge + bwrap")
	rep.add(m, "per session, all but the runtime (PSS)", (oursPSS.mean()+bwrapPSS.mean())/mib, "MiB", 0, "")
	return nil
}

// benchSrtConcurrent starts many srt sessions of `sleep 600` at once, checks
// that all run, stops them all, checks that all exited, removes them, and
// checks that nothing is left behind: no process of ours, no session cgroup,
// no mount under the daemon's home, nothing new in the agent's directory
// (placeholders of protected names).
func benchSrtConcurrent(ctx context.Context, d *daemon, c counts, rep *report) error {
	n := c.SrtConcurrent
	m := fmt.Sprintf("%d concurrent srt sessions (sleep 600)", n)
	if d.srtUnavailable != "" {
		rep.note(m, "start all", "unavailable: "+d.srtUnavailable)
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()

	// Start all at once. Each call waits as long as the daemon bounds a
	// start (the CLI waits longer still): the last of 500 waits most of the
	// whole batch for a start slot, and on 2 cores the batch took 47-60 s:
	// a 60 s bound failed starts the daemon would have made.
	sessions := make([]*adminv1.Session, n)
	startErrs := make([]error, n)
	t0 := time.Now()
	parallel(n, n, func(i int) {
		sctx, cancel := context.WithTimeout(ctx, shimv1.StartTimeout)
		defer cancel()
		sessions[i], startErrs[i] = a.StartSession(sctx, &adminv1.StartSessionRequest{Agent: srtAgent, Command: sleepCommand})
	})
	startTook := time.Since(t0)
	var started []*adminv1.Session
	ids := map[string]bool{}
	for _, s := range sessions {
		if s != nil {
			started = append(started, s)
			ids[s.Id] = true
		}
	}
	removed := map[string]bool{}
	defer func() {
		// Whatever the measurement did not remove goes now.
		var rest []*adminv1.Session
		for _, s := range started {
			if !removed[s.Id] {
				rest = append(rest, s)
			}
		}
		if err := removeSessions(ctx, a, rest); err != nil {
			rep.Errors = append(rep.Errors, m+": "+err.Error())
		}
	}()
	var problems []string
	if failed := countErrors(startErrs); len(failed) > 0 {
		problems = append(problems, fmt.Sprintf("%d of %d starts failed: %s", n-len(started), n, leftovers.Brief(failed, 3)))
	}
	if len(started) == 0 {
		return fmt.Errorf("no session started: %s", strings.Join(problems, "; "))
	}

	// A start this client gave up on (its deadline) is stopped and removed
	// by the daemon once it has run; until then it is listed: wait until
	// the list holds still.
	var list *adminv1.ListSessionsResponse
	for deadline, seen, still := time.Now().Add(2*time.Minute), -1, time.Now(); ; time.Sleep(100 * time.Millisecond) {
		if list, err = a.ListSessions(ctx, &adminv1.ListSessionsRequest{Agent: srtAgent}); err != nil {
			return err
		}
		if len(list.Sessions) != seen {
			seen, still = len(list.Sessions), time.Now()
		}
		if len(started) == n || time.Since(still) > 2*time.Second || time.Now().After(deadline) {
			break
		}
	}
	running := 0
	var late []*adminv1.Session
	for _, s := range list.Sessions {
		if ids[s.Id] && s.State == "running" {
			running++
		}
		if !ids[s.Id] {
			late = append(late, s)
		}
	}
	if len(late) > 0 {
		// Sessions this client did not start that the daemon kept (it
		// removes those of starts their caller gave up on): removed here,
		// so that what is left behind below is the daemon's.
		problems = append(problems, fmt.Sprintf("%d sessions of starts that failed here were still there once the list held still: removed", len(late)))
		if err := removeSessions(ctx, a, late); err != nil {
			problems = append(problems, "remove the late sessions: "+err.Error())
		}
	}
	if running != len(started) {
		problems = append(problems, fmt.Sprintf("%d of %d started sessions running: %s", running, len(started), notRunning(list.Sessions, ids)))
	}
	// What the leftover checks must see go: the proof that they look in
	// the right places.
	roots := leftovers.CgroupRoots(started[0].Cgroup)
	procsRunning := len(oursProcs(d))
	cgroupsRunning := len(leftovers.SessionCgroups(roots, ids))

	// Stop all at once, then wait until none runs.
	t1 := time.Now()
	stopErrs := make([]error, len(started))
	parallel(len(started), len(started), func(i int) {
		// A generous grace: every session ends on the SIGTERM, and with
		// hundreds ending at once the kernel's teardown (cgroups, mount
		// and network namespaces) takes tens of seconds before each exit
		// is recorded.
		_, stopErrs[i] = a.StopSession(ctx, &adminv1.StopSessionRequest{Id: started[i].Id, TimeoutSeconds: 120})
	})
	if failed := countErrors(stopErrs); len(failed) > 0 {
		problems = append(problems, "stop: "+leftovers.Brief(failed, 3))
	}
	var states map[string]int
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		list, err = a.ListSessions(ctx, &adminv1.ListSessionsRequest{Agent: srtAgent})
		if err != nil {
			return err
		}
		states = map[string]int{}
		for _, s := range list.Sessions {
			if ids[s.Id] {
				states[s.State]++
			}
		}
		if states["running"] == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	stopTook := time.Since(t1)
	if states["exited"] != len(started) {
		problems = append(problems, fmt.Sprintf("after stop: %s", formatStates(states)))
	}

	// Remove all at once.
	t2 := time.Now()
	rmErrs := make([]error, len(started))
	parallel(len(started), len(started), func(i int) {
		_, rmErrs[i] = a.RemoveSession(ctx, &adminv1.RemoveSessionRequest{Id: started[i].Id})
	})
	removeTook := time.Since(t2)
	for i, s := range started {
		if rmErrs[i] == nil {
			removed[s.Id] = true
		}
	}
	if failed := countErrors(rmErrs); len(failed) > 0 {
		problems = append(problems, "remove: "+leftovers.Brief(failed, 3))
	}

	// Nothing left behind? Shims exit moments after their session is
	// removed: give them the same grace as the final cleanup does.
	var left []string
	for deadline := time.Now().Add(shimExitGrace); ; time.Sleep(100 * time.Millisecond) {
		left = leftBehind(d, roots, ids)
		if len(left) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}

	rep.add(m, "start all", ms(startTook), "ms", 0, fmt.Sprintf("%d StartSession calls in flight at once; %d running", n, running))
	rep.add(m, "start, per session", ms(startTook)/float64(n), "ms", 0, "start all / N")
	rep.add(m, "stop all", ms(stopTook), "ms", 0, fmt.Sprintf("StopSession (SIGTERM) of all at once until none runs: %s", formatStates(states)))
	rep.add(m, "remove all", ms(removeTook), "ms", 0, "RemoveSession of all at once")
	checked := fmt.Sprintf("checked: processes of ours (%d while running), session cgroups (%d dirs in %d hierarchies while running), mounts under the home, the agent's directory",
		procsRunning, cgroupsRunning, len(roots))
	if len(roots) == 0 {
		checked += "; the sessions have no cgroup here"
	}
	if len(left) == 0 {
		rep.note(m, "nothing left behind", "yes; "+checked)
	} else {
		rep.note(m, "nothing left behind", "NO: "+strings.Join(left, "; "))
		problems = append(problems, "left behind: "+strings.Join(left, "; "))
	}
	if len(problems) > 0 {
		rep.Errors = append(rep.Errors, m+": "+strings.Join(problems, "; "))
	}
	return nil
}

// leftBehind lists what the removed sessions ids left: processes of ours,
// their cgroups, mounts under the home, new paths in the srt agent's
// directory.
func leftBehind(d *daemon, roots []string, ids map[string]bool) []string {
	left := sessionsLeftBehind(d, roots, ids)
	if paths := leftovers.NewPaths(d.srtBaseline, leftovers.AgentTree(d.srtAgentDir)); len(paths) > 0 {
		left = append(left, fmt.Sprintf("%d new path(s) in the agent directory %s: %s", len(paths), d.srtAgentDir, leftovers.Brief(paths, 8)))
	}
	return left
}

// sessionsLeftBehind lists what removed sessions ids of any strategy left:
// processes of ours, their cgroups (in roots), mounts under the home.
func sessionsLeftBehind(d *daemon, roots []string, ids map[string]bool) []string {
	var left []string
	if procs := oursProcs(d); len(procs) > 0 {
		var names []string
		for _, p := range procs {
			names = append(names, p.String())
		}
		left = append(left, fmt.Sprintf("%d process(es) of ours: %s", len(procs), leftovers.Brief(names, 4)))
	}
	if cgs := leftovers.SessionCgroups(roots, ids); len(cgs) > 0 {
		left = append(left, fmt.Sprintf("%d session cgroup(s): %s", len(cgs), leftovers.Brief(cgs, 3)))
	}
	if mounts := leftovers.MountsUnder(d.home); len(mounts) > 0 {
		left = append(left, fmt.Sprintf("%d mount(s) under the home: %s", len(mounts), leftovers.Brief(mounts, 2)))
	}
	return left
}

// parallel runs fn(0..n-1) with at most width at once.
func parallel(n, width int, fn func(i int)) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(n, width); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				fn(i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}

// countErrors returns each distinct error message with how many times it
// occurred, most frequent first.
func countErrors(errs []error) []string {
	counts := map[string]int{}
	for _, err := range errs {
		if err != nil {
			counts[err.Error()]++
		}
	}
	var msgs []string
	for msg := range counts {
		msgs = append(msgs, msg)
	}
	sort.Slice(msgs, func(i, j int) bool {
		if counts[msgs[i]] != counts[msgs[j]] {
			return counts[msgs[i]] > counts[msgs[j]]
		}
		return msgs[i] < msgs[j]
	})
	for i, msg := range msgs {
		msgs[i] = fmt.Sprintf("%dx %s", counts[msg], msg)
	}
	return msgs
}

func formatStates(states map[string]int) string {
	var parts []string
	for state, n := range states {
		parts = append(parts, fmt.Sprintf("%d %s", n, state))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func notRunning(sessions []*adminv1.Session, ids map[string]bool) string {
	var out []string
	for _, s := range sessions {
		if ids[s.Id] && s.State != "running" {
			out = append(out, fmt.Sprintf("%s %s exit %d %s", s.Id, s.State, s.ExitCode, s.Reason))
		}
	}
	return leftovers.Brief(out, 3)
}
