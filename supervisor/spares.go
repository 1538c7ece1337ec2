package supervisor

import (
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// sparePool keeps spare shims (shimv1.StartSpare) of each shim binary that
// the available strategies' cold starts launch: a start hands its session
// to a spare instead of waiting for a process and its Go runtime to start,
// and the pool starts the next spare once that session wrote its first
// output, and no srt start has been in flight for spareQuiet (quiet). A
// spare holds nothing of any agent or session; it exits when the
// supervisor does (its pair closes), so a restart or a crash leaves none
// behind.
type sparePool struct {
	log   *logrus.Logger
	quiet func() bool   // no srt start in flight for spareQuiet
	stop  chan struct{} // closed by close

	mu       sync.Mutex
	ready    map[string][]*shimv1.Spare // by binary, oldest first
	starting map[string]bool            // by binary: a filler runs
	closed   bool
	fillers  sync.WaitGroup
}

// sparesPerShim is how many spares of a binary the pool keeps. With one,
// starts one after another (a loop of execs) get a spare that is still in
// its own start, begun when the start before ended; with two, the one taken
// has had the time of two starts (the newest is ~5 ms of CPU from ready).
// A spare costs ~1.7 MiB PSS (the idle shim's).
const sparesPerShim = 2

// spareQuiet is how long no srt start must have been in flight before a
// spare starts. A process start beside an srt start slows its sandbox
// build more than a spare saves: in a loop of back-to-back srt starts (a
// few milliseconds apart), a spare started between two made the next
// one's boundary step take 24 ms instead of 9. Such a loop launches its
// own shims, as without spares. A host start loses nothing to it (in the
// same kind of loop its first output came at 12 ms with spares refilled
// between starts, 22 ms without), and a VM's boot takes seconds.
const spareQuiet = 25 * time.Millisecond

// spareQuietPoll is how often a filler looks whether starts are quiet.
const spareQuietPoll = 5 * time.Millisecond

func newSparePool(log *logrus.Logger, quiet func() bool) *sparePool {
	return &sparePool{
		log: log, quiet: quiet, stop: make(chan struct{}),
		ready: map[string][]*shimv1.Spare{}, starting: map[string]bool{},
	}
}

// take returns binary's oldest spare, or nil when there is none; fill
// starts the next.
func (p *sparePool) take(binary string) *shimv1.Spare {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.ready[binary]
	if len(q) == 0 {
		return nil
	}
	p.ready[binary] = q[1:]
	return q[0]
}

// fill tops binary's spares up to sparesPerShim in the background, one at
// a time, unless a filler runs already. A spare that cannot start is
// logged and ends the filling; the next fill tries again, and starts launch
// their shims meanwhile.
func (p *sparePool) fill(binary string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.starting[binary] || len(p.ready[binary]) >= sparesPerShim {
		return
	}
	p.starting[binary] = true
	p.fillers.Add(1)
	go func() {
		defer p.fillers.Done()
		for {
			if !p.waitQuiet() {
				p.mu.Lock()
				delete(p.starting, binary)
				p.mu.Unlock()
				return
			}
			sp, err := shimv1.StartSpare(binary)
			p.mu.Lock()
			keep := err == nil && !p.closed
			if keep {
				p.ready[binary] = append(p.ready[binary], sp)
			}
			done := !keep || len(p.ready[binary]) >= sparesPerShim
			if done {
				delete(p.starting, binary)
			}
			p.mu.Unlock()
			if err != nil {
				p.log.WithError(err).WithField("shim", binary).Warn("start a spare shim; cold starts launch their own shim until the next start tries again")
			} else if !keep {
				sp.Discard()
			}
			if done {
				return
			}
		}
	}()
}

// waitQuiet returns true once quiet says so, false if the pool closes
// first.
func (p *sparePool) waitQuiet() bool {
	t := time.NewTicker(spareQuietPoll)
	defer t.Stop()
	for !p.quiet() {
		select {
		case <-p.stop:
			return false
		case <-t.C:
		}
	}
	return true
}

// close discards every spare, and those still starting, and returns once
// they are reaped.
func (p *sparePool) close() {
	p.mu.Lock()
	if !p.closed {
		close(p.stop)
	}
	p.closed = true
	ready := p.ready
	p.ready = map[string][]*shimv1.Spare{}
	p.mu.Unlock()
	for _, q := range ready {
		for _, sp := range q {
			sp.Discard()
		}
	}
	p.fillers.Wait()
}
