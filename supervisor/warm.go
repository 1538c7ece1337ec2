package supervisor

import (
	"context"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/steps"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// warmPool holds each agent's warm boundaries (agent.Warm): shims whose run
// is prepared up to the runtime's exec from the agent's spec (for srt, the
// sandbox built, sandbox-exec waiting), in session directories no session
// owns yet (session.Record.Warm). A session of the agent claims one: the
// supervisor writes the session's own command and env into its record and
// starts it with the run's secrets, which the shim binds then; the pool
// refills in the background. A claimed shim is the session's, never used
// again. A warm shim built from a spec other than what a start now builds
// (the agent, the config, a runtime or the host user changed) is discarded,
// never claimed; a restart discards them all (recovery).
type warmPool struct {
	mu      sync.Mutex
	ready   map[string][]*warmShim // by agent id
	filling map[string]bool        // by agent id: a filler runs
	gen     map[string]uint64      // by agent id: bumped when its warm shims are drained
	// building is the build in flight, by agent id: a drain cancels it
	// and waits for done.
	building map[string]*warmBuild
	fillers  sync.WaitGroup
}

// warmBuild is a build in flight. done is closed once it has ended and
// what it started is gone, or is in the pool.
type warmBuild struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// warmShim is one prepared shim, connected.
type warmShim struct {
	rec  *session.Record
	dir  session.Dir
	conn *shimConn
	boot *session.Bootstrap
}

func newWarmPool() *warmPool {
	return &warmPool{ready: map[string][]*warmShim{}, filling: map[string]bool{}, gen: map[string]uint64{}, building: map[string]*warmBuild{}}
}

// fillWarm tops the agent's warm shims up to its Warm, one at a time, in
// the background. A build that fails is logged and ends the filling: the
// agent's sessions start cold, and the next start tries again.
func (s *Supervisor) fillWarm(agentID string) {
	p := s.warm
	p.mu.Lock()
	if p.filling[agentID] || s.ctx.Err() != nil {
		p.mu.Unlock()
		return
	}
	p.filling[agentID] = true
	p.fillers.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.fillers.Done()
		for {
			s.mu.Lock()
			var ag agent.Agent
			a := s.agents[agentID]
			if a != nil {
				ag = *a
			}
			s.mu.Unlock()
			// The decision to stop and the end of filling are one step, so
			// that a claim meanwhile either sees the filler run or starts
			// another.
			p.mu.Lock()
			if a == nil || !warmable(ag) || len(p.ready[agentID]) >= ag.Warm || s.ctx.Err() != nil {
				delete(p.filling, agentID)
				p.mu.Unlock()
				return
			}
			// A drain meanwhile (the agent changed) makes what is built
			// now stale: the build is cancelled (or, done, discarded), and
			// the next one is built from the agent as it is then.
			gen := p.gen[agentID]
			ctx, cancel := context.WithCancel(s.ctx)
			b := &warmBuild{cancel: cancel, done: make(chan struct{})}
			p.building[agentID] = b
			p.mu.Unlock()
			w, err := s.buildWarm(ctx, ag)
			cancel()
			// Staleness and the pool are one step: a drain either finds
			// the shim in the pool or makes it stale.
			p.mu.Lock()
			stale := p.gen[agentID] != gen || s.ctx.Err() != nil
			if err == nil && !stale {
				p.ready[agentID] = append(p.ready[agentID], w)
			}
			p.mu.Unlock()
			if err == nil && stale {
				s.discardWarm(w) // before done: the drain waits for it
			}
			p.mu.Lock()
			delete(p.building, agentID)
			close(b.done)
			if err != nil && !stale {
				delete(p.filling, agentID)
				p.mu.Unlock()
				s.log.WithError(err).WithField("agent", ag.Name).Warn("build a warm boundary; the agent's sessions start cold until the next start tries again")
				return
			}
			p.mu.Unlock()
		}
	}()
}

// refillWait bounds how long a refill waits for the first output of the
// session that took what it replaces.
const refillWait = time.Second

// refillWarm refills the agent's warm boundaries: at once when a start
// claimed none (claimed nil), else after the claiming session's first
// output (afterFirstOutput).
func (s *Supervisor) refillWarm(agentID string, claimed *warmShim) {
	if claimed == nil {
		s.fillWarm(agentID)
		return
	}
	s.afterFirstOutput(claimed.dir, func() { s.fillWarm(agentID) })
}

// afterFirstOutput runs fill once the output log in dir has its first byte
// (or is gone), or after refillWait. The first moments of a session that
// took a warm boundary or a spare shim are what its user waits for, and
// the refill (a process start; a VM's boot takes a core for seconds) would
// slow them.
func (s *Supervisor) afterFirstOutput(dir session.Dir, fill func()) {
	firstOutput := dir.OutputPath()
	go func() {
		deadline := time.Now().Add(refillWait)
		for time.Now().Before(deadline) && s.ctx.Err() == nil {
			if fi, err := os.Stat(firstOutput); err != nil || fi.Size() > 0 {
				break // the session wrote, or is gone
			}
			time.Sleep(5 * time.Millisecond)
		}
		fill()
	}()
}

// warmable reports whether a's sessions have warm boundaries.
func warmable(a agent.Agent) bool { return a.Warm > 0 }

// buildWarm starts one warm shim of ag and waits until its run is prepared,
// or ctx ends. A build that fails or is cancelled leaves nothing: its shim
// is killed (shimv1.Launch), and what it prepared goes with its run's
// leftovers (the sandbox's processes, placeholders, a VM's directories).
func (s *Supervisor) buildWarm(ctx context.Context, ag agent.Agent) (_ *warmShim, retErr error) {
	spec, _, err := s.buildSpec(ag, nil) // the secrets' values come with a claim
	if err != nil {
		return nil, err
	}
	id := agent.NewID()
	dir := session.Dir(s.layout.SessionDir(id))
	if err := os.Mkdir(string(dir), 0o700); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.removeSessionFiles(id)
		}
	}()
	if f, err := os.OpenFile(dir.OutputPath(), os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		f.Close()
	}
	rec := &session.Record{
		ID: id, AgentID: ag.ID, Agent: ag.Name, Strategy: ag.Strategy,
		CreatedAt: time.Now().UTC(), Run: 1, Spec: spec, Warm: true,
	}
	st := steps.New()
	conn, boot, err := s.launchShim(ctx, dir, rec, st)
	if err != nil {
		s.removeRunLeftovers(rec)
		return nil, err
	}
	s.log.WithFields(logrus.Fields{"agent": ag.Name, "warm": id, "shim": boot.PID, "steps": st.String()}).Info("warm boundary ready")
	return &warmShim{rec: rec, dir: dir, conn: conn, boot: boot}, nil
}

// claimWarm takes one of ag's warm shims for a session whose spec is spec,
// or returns nil: none is ready, or they were built from another spec (then
// all of ag's go, and the pool refills from the new one).
func (s *Supervisor) claimWarm(ag agent.Agent, spec session.Spec) *warmShim {
	p := s.warm
	p.mu.Lock()
	list := p.ready[ag.ID]
	if len(list) == 0 {
		p.mu.Unlock()
		return nil
	}
	w := list[0]
	p.ready[ag.ID] = list[1:]
	p.mu.Unlock()
	log := s.log.WithFields(logrus.Fields{"agent": ag.Name, "warm": w.rec.ID})
	switch {
	case !sameBoundary(w.rec.Spec, spec):
		// The session starts cold meanwhile: the discards are not its
		// to wait for.
		log.Info("warm boundaries built from an earlier spec of the agent: discarded")
		rest, _ := s.takeWarm(ag.ID)
		go s.discardAll(append(rest, w))
		return nil
	case !procstat.Alive(w.boot.PID, w.boot.StartTime):
		log.Warn("warm boundary's shim is gone: discarded")
		s.discardWarm(w)
		return nil
	}
	// Built at background priority (launchShim); the session is not.
	if err := (cgroupfs.Cgroup{Dirs: w.rec.Spec.Cgroup}).SetBackground(false); err != nil {
		log.WithError(err).Warn("give a warm boundary its CPU weight back; discarded, the session starts cold")
		go s.discardWarm(w)
		return nil
	}
	return w
}

// sameBoundary reports whether a run prepared from a is what a start now
// builds from b, but for what a claim binds (command, env) and where the
// run was placed (its cgroup; its VM's directories and vsock CID).
func sameBoundary(a, b session.Spec) bool {
	for _, sp := range []*session.Spec{&a, &b} {
		sp.Command, sp.CommandOverride, sp.Env, sp.Cgroup = nil, false, nil, nil
		if sp.VM != nil {
			vm := *sp.VM
			vm.Dir, vm.RunDir, vm.CID = "", "", 0
			sp.VM = &vm
		}
	}
	return reflect.DeepEqual(a, b)
}

// warmReady is how many of the agent's warm shims are ready.
func (s *Supervisor) warmReady(agentID string) int {
	s.warm.mu.Lock()
	defer s.warm.mu.Unlock()
	return len(s.warm.ready[agentID])
}

// waitFilled waits until no filler runs for the agent (one that finds the
// agent gone stops after the build in flight).
func (s *Supervisor) waitFilled(agentID string) {
	for {
		s.warm.mu.Lock()
		filling := s.warm.filling[agentID]
		s.warm.mu.Unlock()
		if !filling {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// drainWarm discards the agent's warm shims and cancels the one being
// built, and returns once all are gone: an agent edited to fewer warm
// boundaries (or none) has no more once its edit is answered.
func (s *Supervisor) drainWarm(agentID string) {
	list, building := s.takeWarm(agentID)
	s.discardAll(list)
	if building != nil {
		<-building
	}
}

// takeWarm takes the agent's warm shims out of the pool and cancels the
// build in flight, if any, whose end building reports.
func (s *Supervisor) takeWarm(agentID string) (list []*warmShim, building <-chan struct{}) {
	p := s.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen[agentID]++
	list = p.ready[agentID]
	delete(p.ready, agentID)
	if b := p.building[agentID]; b != nil {
		b.cancel()
		building = b.done
	}
	return list, building
}

// closeWarm discards every warm shim once the supervisor stops: the next
// one builds its own (recovery discards what a killed one left).
func (s *Supervisor) closeWarm() {
	p := s.warm
	p.fillers.Wait() // s.ctx is done: their builds are cancelled
	p.mu.Lock()
	var all []*warmShim
	for id, list := range p.ready {
		all = append(all, list...)
		delete(p.ready, id)
	}
	p.mu.Unlock()
	s.discardAll(all)
}

func (s *Supervisor) discardAll(list []*warmShim) {
	var wg sync.WaitGroup
	for _, w := range list {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.discardWarm(w)
		}()
	}
	wg.Wait()
}

// discardWarm ends a warm shim no session claimed: the shim discards its
// prepared run and exits (killed if it does not), and its directory,
// cgroup and socket go.
func (s *Supervisor) discardWarm(w *warmShim) {
	s.endWarm(w.rec, w.boot, w.conn, callTimeout, shimExitTimeout)
}

// warmLeftoverExit is how long recovery waits for an earlier supervisor's
// warm shim to exit once asked: a prepared one discards its run at once,
// one still preparing (a VM booting) would only exit when its boot ends,
// seconds during which no session could be served; it is killed instead
// (its cgroup kill takes the rest).
const warmLeftoverExit = time.Second

// removeWarmLeftover removes what a warm shim of an earlier supervisor
// left: the shim, its run's leftovers and its directory (recovery).
func (s *Supervisor) removeWarmLeftover(dir session.Dir, rec *session.Record) {
	boot, _ := dir.ReadBootstrap()
	if boot == nil || boot.Run != rec.Run {
		s.endWarm(rec, nil, nil, 0, 0)
		return
	}
	conn, _ := dialShim(s.ctx, boot, adoptTimeout)
	s.endWarm(rec, boot, conn, adoptTimeout, warmLeftoverExit)
}

// endWarm ends the warm shim of boot (nil: none was started): asked over
// conn (nil: it did not answer) to shut down within timeout, and killed
// unless it has exited within exitTimeout; then the run's leftovers and its
// directories go.
func (s *Supervisor) endWarm(rec *session.Record, boot *session.Bootstrap, conn *shimConn, timeout, exitTimeout time.Duration) {
	if boot != nil {
		gone := false
		if conn != nil {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			_, err := conn.shim.Shutdown(ctx, &shimv1.ShutdownRequest{})
			cancel()
			conn.close()
			gone = err == nil && waitGone(boot.PID, boot.StartTime, exitTimeout)
		}
		if !gone {
			s.stopShim(boot)
		}
	}
	s.removeRunLeftovers(rec)
	s.removeSessionFiles(rec.ID)
}
