package supervisor

import (
	"sync"
	"time"
)

// event is something that happened, for `agentconnect events`.
type event struct {
	Time      time.Time
	Type      string
	SessionID string
	Agent     string
	Message   string
	ExitCode  int
}

// eventLogSize is how many past events a new reader gets.
const eventLogSize = 1000

// subscriberBuffer is how far a follower may fall behind before it is cut
// off: a stuck client must not hold the daemon's memory.
const subscriberBuffer = 256

// eventLog keeps the recent events and hands new ones to followers.
type eventLog struct {
	mu sync.Mutex // guards the fields below
	// ring holds the last eventLogSize events: an add overwrites the
	// oldest in place, so adding never copies the log.
	ring  [eventLogSize]event
	start int // index of the oldest event
	n     int // events held
	subs  map[chan event]struct{}
}

func newEventLog() *eventLog {
	return &eventLog{subs: map[chan event]struct{}{}}
}

func (l *eventLog) add(e event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n < eventLogSize {
		l.ring[(l.start+l.n)%eventLogSize] = e
		l.n++
	} else {
		l.ring[l.start] = e
		l.start = (l.start + 1) % eventLogSize
	}
	for ch := range l.subs {
		select {
		case ch <- e:
		default:
			// Too slow: close it, and the follower's stream ends.
			delete(l.subs, ch)
			close(ch)
		}
	}
}

// recentLocked copies the events held, oldest first.
func (l *eventLog) recentLocked() []event {
	out := make([]event, 0, l.n)
	end := l.start + l.n
	if end <= eventLogSize {
		return append(out, l.ring[l.start:end]...)
	}
	out = append(out, l.ring[l.start:]...)
	return append(out, l.ring[:end-eventLogSize]...)
}

// subscribe returns the recent events and a channel of the next ones. The
// channel is closed when the follower falls too far behind; cancel stops it.
func (l *eventLog) subscribe() (past []event, next <-chan event, cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan event, subscriberBuffer)
	l.subs[ch] = struct{}{}
	return l.recentLocked(), ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, ok := l.subs[ch]; ok {
			delete(l.subs, ch)
			close(ch)
		}
	}
}

// snapshot returns the recent events, oldest first.
func (l *eventLog) snapshot() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recentLocked()
}
