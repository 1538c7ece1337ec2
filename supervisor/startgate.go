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
	slots   map[strategy.Name]chan struct{}
	lastEnd map[strategy.Name]*atomic.Int64 // when a slot was last given back, Unix ns
}

func newStartGate() *startGate {
	n := startsPerCPU * runtime.NumCPU()
	g := &startGate{slots: map[strategy.Name]chan struct{}{}, lastEnd: map[strategy.Name]*atomic.Int64{}}
	for _, name := range strategy.All {
		g.slots[name] = make(chan struct{}, n)
		g.lastEnd[name] = new(atomic.Int64)
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
		return g.taken(name), false, nil
	default:
	}
	select {
	case slots <- struct{}{}:
		return g.taken(name), true, nil
	case <-caller.Done():
		return nil, true, fmt.Errorf("waiting for one of the %d %s starts in flight to end: %w", cap(slots), name, context.Cause(caller))
	case <-stop.Done():
		return nil, true, errdefs.Unavailable("the daemon is stopping: start the session again once it runs")
	}
}

// taken returns what gives back the slot of name just taken.
func (g *startGate) taken(name strategy.Name) func() {
	return func() {
		g.lastEnd[name].Store(time.Now().UnixNano())
		<-g.slots[name]
	}
}

// quiet reports whether no start of name has been in flight for at least
// d; a name without slots always is.
func (g *startGate) quiet(name strategy.Name, d time.Duration) bool {
	end := g.lastEnd[name]
	return end == nil || len(g.slots[name]) == 0 && time.Since(time.Unix(0, end.Load())) >= d
}
