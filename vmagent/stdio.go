package vmagent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// Limits on the stdio connections that wait for their Exec.
const (
	// maxPendingStreams bounds the connections waiting: three per process,
	// for a few processes being started at once.
	maxPendingStreams = 48
	// pendingTimeout is how long a connection waits for its Exec before it
	// is closed: the shim opens them right before Exec.
	pendingTimeout = 30 * time.Second
	// streamWait bounds how long Exec waits for the streams it names.
	streamWait = 10 * time.Second
)

// stdio indexes.
const (
	stdin = iota
	stdout
	stderr
)

var streamKinds = [3]string{vmtransport.KindStdin, vmtransport.KindStdout, vmtransport.KindStderr}

// pendingStreams holds the stdio connections that arrived before the Exec
// of their process.
type pendingStreams struct {
	logf        func(string, ...any)
	expireAfter time.Duration // pendingTimeout; shorter in tests
	max         int           // maxPendingStreams

	// mu guards the fields that follow.
	mu      sync.Mutex
	byID    map[string]*[3]net.Conn
	count   int           // connections in byID
	reading int           // connections whose preface is being read
	changed chan struct{} // closed and replaced on every change
}

func newPendingStreams(logf func(string, ...any)) *pendingStreams {
	return &pendingStreams{
		logf:        logf,
		expireAfter: pendingTimeout,
		max:         maxPendingStreams,
		byID:        map[string]*[3]net.Conn{},
		changed:     make(chan struct{}),
	}
}

func (p *pendingStreams) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// startReading counts a connection whose preface is being read; add or
// doneReading ends it. Exec waits for these, as one may be its stream.
func (p *pendingStreams) startReading() {
	p.mu.Lock()
	p.reading++
	p.mu.Unlock()
}

func (p *pendingStreams) doneReading() {
	p.mu.Lock()
	p.reading--
	p.notifyLocked()
	p.mu.Unlock()
}

// add keeps conn as stream kind of process id until take claims it, or
// closes it after pendingTimeout. It ends the reading that startReading
// began, refused or not.
func (p *pendingStreams) add(id, kind string, conn net.Conn) error {
	i := kindIndex(kind)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reading--
	p.notifyLocked()
	if p.count >= p.max {
		return errdefs.ResourceExhausted("%s stream of process %s refused: %d streams already wait for their Exec", kind, id, p.count)
	}
	set := p.byID[id]
	if set == nil {
		set = new([3]net.Conn)
		p.byID[id] = set
	}
	if set[i] != nil {
		return errdefs.AlreadyExists("%s stream of process %s refused: it is already connected", kind, id)
	}
	set[i] = conn
	p.count++
	time.AfterFunc(p.expireAfter, func() { p.expire(id, i, conn) })
	return nil
}

func kindIndex(kind string) int {
	for i, k := range streamKinds {
		if k == kind {
			return i
		}
	}
	panic("vmagent: not a stdio kind: " + kind)
}

// expire closes conn if it still waits.
func (p *pendingStreams) expire(id string, i int, conn net.Conn) {
	p.mu.Lock()
	set := p.byID[id]
	if set == nil || set[i] != conn {
		p.mu.Unlock()
		return
	}
	p.removeLocked(id, i)
	p.mu.Unlock()
	p.logf("%s stream of process %s closed: no Exec within %v", streamKinds[i], id, p.expireAfter)
	conn.Close()
}

func (p *pendingStreams) removeLocked(id string, i int) {
	set := p.byID[id]
	set[i] = nil
	p.count--
	if set[stdin] == nil && set[stdout] == nil && set[stderr] == nil {
		delete(p.byID, id)
	}
}

// take claims the streams of process id. It waits, at most wait, until
// every stream marked in want has arrived and no preface is being read;
// then it returns what has arrived. A wanted stream still missing at the
// end is an error, and the others are closed.
func (p *pendingStreams) take(ctx context.Context, id string, want [3]bool, wait time.Duration) ([3]net.Conn, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	timedOut := false
	for {
		p.mu.Lock()
		set := p.byID[id]
		var got [3]net.Conn
		if set != nil {
			got = *set
		}
		var missing []string
		for i, w := range want {
			if w && got[i] == nil {
				missing = append(missing, streamKinds[i])
			}
		}
		if timedOut || (len(missing) == 0 && p.reading == 0) {
			for i := range got {
				if got[i] != nil {
					p.removeLocked(id, i)
				}
			}
			p.mu.Unlock()
			if len(missing) > 0 {
				closeAll(got)
				return [3]net.Conn{}, errdefs.FailedPrecondition("exec %s: its %s stream did not arrive within %v", id, strings.Join(missing, " and "), wait)
			}
			return got, nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			timedOut = true
		case <-ctx.Done():
			return [3]net.Conn{}, fmt.Errorf("exec %s: wait for its streams: %w", id, ctx.Err())
		}
	}
}

func closeAll(conns [3]net.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}
