package supervisor

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// startsPerCPU bounds, per strategy and per CPU, the runs whose shim and
// boundary are being built at once. The work of a start is mostly CPU and
// the kernel's mount and namespace locks, which are global: 500 srt starts
// let in at once share them 500 ways, and the last of them waited over 20
// s for its sandbox, where a start let in a few at a time takes well under
// a second and the whole batch no longer (see the design notes, "A start
// waits for a slot").
const startsPerCPU = 4

// startGate holds the start slots of each strategy. A strategy's starts
// never wait for another's: a VM's boot takes seconds, an srt start tens
// of milliseconds.
type startGate struct {
	slots map[strategy.Name]chan struct{}

	inFlight atomic.Int32 // slots taken, every strategy
	lastEnd  atomic.Int64 // when a slot was last given back, Unix ns
}

func newStartGate() *startGate {
	n := startsPerCPU * runtime.NumCPU()
	g := &startGate{slots: map[strategy.Name]chan struct{}{}}
	for _, name := range strategy.All {
		g.slots[name] = make(chan struct{}, n)
	}
	return g
}

// acquire waits for one of the strategy name's slots, until caller (the
// start's caller gave up) or stop (the supervisor stops) ends; release gives
// the slot back, and waited says whether no slot was free at once. A name
// without slots (none known) never waits.
func (g *startGate) acquire(caller, stop context.Context, name strategy.Name) (release func(), waited bool, err error) {
	slots := g.slots[name]
	if slots == nil {
		return func() {}, false, nil
	}
	select {
	case slots <- struct{}{}:
		return g.taken(slots), false, nil
	default:
	}
	select {
	case slots <- struct{}{}:
		return g.taken(slots), true, nil
	case <-caller.Done():
		return nil, true, fmt.Errorf("waiting for one of the %d %s starts in flight to end: %w", cap(slots), name, context.Cause(caller))
	case <-stop.Done():
		return nil, true, errdefs.Unavailable("the daemon is stopping: start the session again once it runs")
	}
}

// taken counts a slot just taken of slots, and returns what gives it back.
func (g *startGate) taken(slots chan struct{}) func() {
	g.inFlight.Add(1)
	return func() {
		g.lastEnd.Store(time.Now().UnixNano())
		g.inFlight.Add(-1)
		<-slots
	}
}

// quiet reports whether no start has been in flight, of any strategy, for
// at least d.
func (g *startGate) quiet(d time.Duration) bool {
	return g.inFlight.Load() == 0 && time.Since(time.Unix(0, g.lastEnd.Load())) >= d
}
