package supervisor

import (
	"strconv"
	"testing"
	"time"
)

func messages(es []event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Message
	}
	return out
}

// checkRange checks that es are the events numbered from to to-1, in order.
func checkRange(t *testing.T, what string, es []event, from, to int) {
	t.Helper()
	if len(es) != to-from {
		t.Fatalf("%s: %d events, want %d", what, len(es), to-from)
	}
	for i, e := range es {
		if e.Message != strconv.Itoa(from+i) {
			t.Fatalf("%s: event %d is %q, want %d (all: %v)", what, i, e.Message, from+i, messages(es))
		}
	}
}

func TestEventLogKeepsTheLatestInOrder(t *testing.T) {
	l := newEventLog()
	next := 0
	add := func(n int) {
		for range n {
			l.add(event{Type: "test", Message: strconv.Itoa(next)})
			next++
		}
	}
	add(10)
	checkRange(t, "10 events", l.snapshot(), 0, 10)
	add(eventLogSize - 10)
	checkRange(t, "a full log", l.snapshot(), 0, eventLogSize)
	add(1)
	checkRange(t, "one past full", l.snapshot(), 1, eventLogSize+1)
	add(2*eventLogSize + 37)
	checkRange(t, "wrapped several times", l.snapshot(), next-eventLogSize, next)

	past, ch, cancel := l.subscribe()
	defer cancel()
	checkRange(t, "subscribe", past, next-eventLogSize, next)
	add(3)
	for i := range 3 {
		select {
		case e := <-ch:
			if e.Message != strconv.Itoa(next-3+i) {
				t.Fatalf("followed event %d is %q, want %d", i, e.Message, next-3+i)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a subscriber got no event")
		}
	}
}

// TestEventLogAddDoesNotCopy: a full log takes a new event in place. The
// log used to copy its 1000 events on every add once full, which a flood
// of events (a loop of refused connections) turned into a flood of copies.
func TestEventLogAddDoesNotCopy(t *testing.T) {
	l := newEventLog()
	e := event{Time: time.Now(), Type: "session.violation", SessionID: "s", Message: "m"}
	for range eventLogSize + 1 {
		l.add(e)
	}
	if allocs := testing.AllocsPerRun(1000, func() { l.add(e) }); allocs != 0 {
		t.Errorf("adding to a full event log allocates %v times, want 0", allocs)
	}
}
