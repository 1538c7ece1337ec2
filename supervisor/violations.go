package supervisor

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sort"
	"strconv"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/internal/filewatch"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// readViolations returns a session's refusals, the kinds kept ordered by
// when they were last seen, the latest last. violations.json is bounded, so
// this costs the same however many connections were refused.
func readViolations(dir session.Dir) *session.Violations {
	v, _ := dir.ReadViolations()
	sort.SliceStable(v.Entries, func(i, j int) bool { return v.Entries[i].Time.Before(v.Entries[j].Time) })
	return v
}

// violationFollower sends a session.violation event for each new kind of
// refusal the shim of a run records in violations.json: one per kind, none
// for repeats, so at most session.MaxViolationKinds per session.
type violationFollower struct {
	stop chan struct{}
	done chan struct{}
}

// followViolations follows a session's violations.json while its run lasts.
func (s *Supervisor) followViolations(ss *sessionState) *violationFollower {
	f := &violationFollower{stop: make(chan struct{}), done: make(chan struct{})}
	go f.run(s, ss)
	return f
}

// finish reports what the shim recorded last and stops the follower. The
// shim writes its last refusals before it records the exit, so called once
// the exit is known, it sends their events before the exit's.
func (f *violationFollower) finish() {
	if f == nil {
		return
	}
	close(f.stop)
	<-f.done
}

func (f *violationFollower) run(s *Supervisor, ss *sessionState) {
	defer close(f.done)
	w, err := filewatch.WatchReplaced(ss.dir.ViolationsPath())
	if err != nil {
		s.sessionLog(ss).WithError(err).Warn("follow network violations")
		return
	}
	defer func() { go w.Close() }() // see attach
	var reported session.ViolationsReported
	if err := atomicfile.ReadJSON(ss.dir.ViolationsReportedPath(), &reported); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.sessionLog(ss).WithError(err).Warn("read violations-reported.json; reporting violations from the first")
	}
	for {
		s.reportViolations(ss, &reported)
		select {
		case <-w.C:
		case <-f.stop:
			s.reportViolations(ss, &reported)
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// reportViolations sends the events of the kinds not reported yet. The count
// is recorded first: after a crash in between, a kind's event is missing
// rather than sent twice.
func (s *Supervisor) reportViolations(ss *sessionState, reported *session.ViolationsReported) {
	v, err := ss.dir.ReadViolations()
	if err != nil {
		return
	}
	if len(v.Entries) < reported.Entries {
		// The shim started a new file (the old one was damaged).
		reported.Entries = 0
	}
	from := max(reported.Entries, v.Imported)
	if from >= len(v.Entries) {
		return
	}
	reported.Entries = len(v.Entries)
	if err := atomicfile.WriteVolatileJSON(ss.dir.ViolationsReportedPath(), reported, 0o600); err != nil {
		s.sessionLog(ss).WithError(err).Warn("record reported violations")
	}
	agentName := ss.record().Agent
	for _, e := range v.Entries[from:] {
		msg := fmt.Sprintf("file %s: %s", e.Host, e.Reason)
		if e.Protocol != netpolicy.ProtocolFile {
			dest := e.Host
			if e.Port != 0 {
				dest = net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
			}
			msg = fmt.Sprintf("%s %s refused: %s", e.Protocol, dest, e.Reason)
		}
		s.events.add(event{Type: "session.violation", SessionID: ss.id, Agent: agentName, Message: msg})
	}
}
