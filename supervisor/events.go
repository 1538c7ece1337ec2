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
	mu     sync.Mutex // guards the fields below
	recent []event
	subs   map[chan event]struct{}
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
	l.recent = append(l.recent, e)
	if len(l.recent) > eventLogSize {
		l.recent = append(l.recent[:0:0], l.recent[len(l.recent)-eventLogSize:]...)
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

// subscribe returns the recent events and a channel of the next ones. The
// channel is closed when the follower falls too far behind; cancel stops it.
func (l *eventLog) subscribe() (past []event, next <-chan event, cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch := make(chan event, subscriberBuffer)
	l.subs[ch] = struct{}{}
	past = append([]event(nil), l.recent...)
	return past, ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, ok := l.subs[ch]; ok {
			delete(l.subs, ch)
			close(ch)
		}
	}
}

// snapshot returns the recent events.
func (l *eventLog) snapshot() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event(nil), l.recent...)
}
