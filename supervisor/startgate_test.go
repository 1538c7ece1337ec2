package supervisor

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// TestStartGate: a strategy's starts beyond its slots wait until one ends,
// their caller gives up or the supervisor stops; another strategy's do not
// wait for them.
func TestStartGate(t *testing.T) {
	g := newStartGate()
	bg := context.Background()
	n := cap(g.slots[strategy.SRT])
	if n != startsPerCPU*runtime.NumCPU() {
		t.Fatalf("srt has %d start slots, want %d per CPU", n, startsPerCPU)
	}
	if !g.quiet(strategy.SRT, time.Hour) {
		t.Fatal("a gate no start ever took is not quiet")
	}
	var releases []func()
	for i := 0; i < n; i++ {
		release, waited, err := g.acquire(bg, bg, strategy.SRT)
		if err != nil || waited {
			t.Fatalf("slot %d of %d: waited %v, %v", i+1, n, waited, err)
		}
		releases = append(releases, release)
	}

	if g.quiet(strategy.SRT, 0) {
		t.Fatal("quiet while starts are in flight")
	}
	if !g.quiet(strategy.Host, time.Hour) {
		t.Fatal("host's starts are not quiet while only srt's are in flight")
	}

	// Full: a caller that gives up gets an error that says why.
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	if _, waited, err := g.acquire(ctx, bg, strategy.SRT); err == nil || !waited || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a start beyond the slots: waited %v, %v; want the caller's deadline", waited, err)
	}
	// The supervisor stopping ends the wait too.
	stop, stopNow := context.WithCancel(bg)
	stopNow()
	if _, _, err := g.acquire(bg, stop, strategy.SRT); errdefs.CodeOf(err) != errdefs.CodeOf(errdefs.Unavailable("x")) {
		t.Fatalf("a start while the supervisor stops: %v, want unavailable", err)
	}
	// Another strategy has slots of its own.
	if release, waited, err := g.acquire(bg, bg, strategy.Host); err != nil || waited {
		t.Fatalf("a host start while srt's slots are taken: waited %v, %v", waited, err)
	} else {
		release()
	}

	// A slot given back lets one waiting start in.
	got := make(chan error, 1)
	go func() {
		release, waited, err := g.acquire(bg, bg, strategy.SRT)
		if err == nil {
			release()
			if !waited {
				err = errors.New("it did not wait")
			}
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a start got in while every slot was taken: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	releases[0]()
	if err := <-got; err != nil {
		t.Fatalf("the waiting start: %v", err)
	}
	for _, release := range releases[1:] {
		release()
	}
	if len(g.slots[strategy.SRT]) != 0 {
		t.Errorf("%d slots still taken after every start released its own", len(g.slots[strategy.SRT]))
	}
	// Quiet counts from the last start's end (spares wait for it).
	if !g.quiet(strategy.SRT, 0) || g.quiet(strategy.SRT, time.Hour) {
		t.Errorf("after the last start ended: quiet(0) %v, quiet(1h) %v; want true, false", g.quiet(strategy.SRT, 0), g.quiet(strategy.SRT, time.Hour))
	}
}

// TestStartGivenUpWhileWaitingLeavesNothing: a start whose caller gives up
// while every slot of its strategy is taken answers with an error that
// names the wait, and leaves no session, no session directory and no
// count that would keep its agent from being removed.
func TestStartGivenUpWhileWaitingLeavesNothing(t *testing.T) {
	s := newTestSupervisor(t, "", nil)
	if _, err := s.createAgent(context.Background(), agent.Agent{Name: "x", Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	for range cap(s.gate.slots[strategy.Host]) {
		release, _, err := s.gate.acquire(bg, bg, strategy.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
	}
	ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
	defer cancel()
	_, err := s.startSession(ctx, "x", nil)
	if err == nil || !strings.Contains(err.Error(), "waiting for one of the") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("startSession with every slot taken = %v, want the wait's error", err)
	}
	if entries, _ := os.ReadDir(s.layout.SessionsDir()); len(entries) != 0 {
		t.Errorf("the start given up left %d entries in sessions/", len(entries))
	}
	if err := s.deleteAgent("x"); err != nil {
		t.Errorf("remove the agent after the start gave up: %v", err)
	}
}
