package supervisor

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// sessionState is the supervisor's view of one session. What it holds is
// always reconciled from the shim or from the session's files, never from
// events alone.
type sessionState struct {
	id  string
	dir session.Dir

	// opMu serializes the lifecycle calls on this session (start, resume,
	// stop, rm), so that they never interleave.
	opMu sync.Mutex

	mu        sync.Mutex // guards the fields below
	rec       *session.Record
	state     string // running, exited or lost
	pid       int    // the runtime's
	shimPID   int
	exitCode  int
	reason    string
	startedAt time.Time
	exitedAt  time.Time
	conn      *shimConn // while connected to a live shim
	removed   bool
	// changed is closed and replaced whenever the fields above change, so
	// that waiters and output followers wake up.
	changed chan struct{}
}

func newSessionState(dir session.Dir, rec *session.Record) *sessionState {
	return &sessionState{id: rec.ID, dir: dir, rec: rec, changed: make(chan struct{})}
}

func (ss *sessionState) notifyLocked() {
	close(ss.changed)
	ss.changed = make(chan struct{})
}

// view is a consistent copy of a session, for the API.
type view struct {
	ID, AgentID, Agent string
	Strategy           strategy.Name
	State              string
	PID, ShimPID       int
	ExitCode           int
	Reason             string
	Run                uint32
	CreatedAt          time.Time
	StartedAt          time.Time
	ExitedAt           time.Time
	OutputBytes        int64
	Command            []string
	Cgroup             string
	Limits             string
	NativeSandbox      string
	Workspace          string
	RunAs              string
}

func (ss *sessionState) view() view {
	ss.mu.Lock()
	v := view{
		ID: ss.id, AgentID: ss.rec.AgentID, Agent: ss.rec.Agent, Strategy: ss.rec.Strategy,
		State: ss.state, PID: ss.pid, ShimPID: ss.shimPID, ExitCode: ss.exitCode, Reason: ss.reason,
		Run: ss.rec.Run, CreatedAt: ss.rec.CreatedAt, StartedAt: ss.startedAt, ExitedAt: ss.exitedAt,
		Command: ss.rec.Spec.Command, Limits: ss.rec.Spec.LimitsNote, NativeSandbox: ss.rec.Spec.NativeSandbox,
		Workspace: ss.rec.Spec.Workspace,
	}
	if u := ss.rec.Spec.RunAs; u != nil {
		v.RunAs = fmt.Sprintf("%s (uid %d)", u.Name, u.UID)
	}
	if len(ss.rec.Spec.Cgroup) > 0 {
		v.Cgroup = ss.rec.Spec.Cgroup[0]
	}
	ss.mu.Unlock()
	if fi, err := os.Stat(ss.dir.OutputPath()); err == nil {
		v.OutputBytes = fi.Size()
	}
	return v
}

func (ss *sessionState) record() *session.Record {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.rec
}

func (ss *sessionState) agentID() string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.rec.AgentID
}

func (ss *sessionState) isRunning() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.state == session.Running
}

// watch returns the state and a channel closed at the next change.
func (ss *sessionState) watch() (state string, removed bool, changed <-chan struct{}) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.state, ss.removed, ss.changed
}

func (ss *sessionState) setRunning(conn *shimConn, pid int, startedAt time.Time) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.state, ss.conn, ss.pid, ss.startedAt = session.Running, conn, pid, startedAt
	ss.shimPID = conn.pid
	ss.exitCode, ss.reason, ss.exitedAt = 0, "", time.Time{}
	ss.notifyLocked()
}

// setEnded records how the current run ended (exited or lost).
func (ss *sessionState) setEnded(st *session.Status) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.state, ss.exitCode, ss.reason = st.State, st.ExitCode, st.Reason
	ss.pid, ss.startedAt, ss.exitedAt = st.PID, st.StartedAt, st.ExitedAt
	ss.conn = nil
	ss.notifyLocked()
}

// setUnanswered marks a session whose shim is alive but does not answer:
// running by /proc, with the reason.
func (ss *sessionState) setUnanswered(pid, shimPID int, reason string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.state, ss.pid, ss.shimPID, ss.reason, ss.conn = session.Running, pid, shimPID, reason, nil
	ss.notifyLocked()
}

func (ss *sessionState) connection() *shimConn {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.conn
}

func (ss *sessionState) isRemoved() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.removed
}

func (ss *sessionState) markRemoved() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.removed = true
	ss.notifyLocked()
}

// detach closes the connection to the shim and leaves the shim running.
func (ss *sessionState) detach() {
	ss.mu.Lock()
	conn := ss.conn
	ss.mu.Unlock()
	if conn != nil {
		conn.close()
	}
}

// wait blocks until the session is not running, or ctx ends.
func (ss *sessionState) wait(ctx context.Context) error {
	for {
		state, removed, changed := ss.watch()
		if state != session.Running || removed {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
