package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/probe"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// NotOffered is what an agent whose strategy this daemon does not offer
// shows, in the seed documents' words.
const NotOffered = "Not offered where this agent is placed."

// loadAgents reads the agent store and maps legacy agents once.
func (s *Supervisor) loadAgents() error {
	s.store.CleanTrash()
	agents, problems, err := s.store.Load()
	if err != nil {
		return err
	}
	for _, p := range problems {
		s.log.WithError(p).Warn("skipping an agent that cannot be read")
	}
	for _, a := range agents {
		if a.RunInSandbox != nil {
			s.mapLegacy(a)
		}
		s.agents[a.ID] = a
	}
	return nil
}

// mapLegacy gives an agent made before strategies existed the boundary it
// had: Run in sandbox off is host; on is the daemon's retired
// sandbox.backend, else srt. The mapping is saved, so it happens once.
func (s *Supervisor) mapLegacy(a *agent.Agent) {
	if a.Strategy == "" {
		a.Strategy = strategy.Host
		if *a.RunInSandbox {
			a.Strategy = strategy.SRT
			if s.cfg.Backend != "" {
				a.Strategy = s.cfg.Backend
			}
		}
	}
	legacy := *a.RunInSandbox
	a.RunInSandbox = nil
	if err := s.store.Save(a); err != nil {
		s.log.WithError(err).WithField("agent", a.Name).Error("save legacy agent mapping")
		return
	}
	s.log.WithField("agent", a.Name).Infof("mapped legacy runInSandbox=%t to execution strategy %s", legacy, a.Strategy)
}

// agentByNameLocked finds an agent by name; the caller holds s.mu.
func (s *Supervisor) agentByNameLocked(name string) (*agent.Agent, error) {
	for _, a := range s.agents {
		if a.Name == name {
			return a, nil
		}
	}
	return nil, errdefs.NotFound("no agent named %q (agent ls lists them)", name)
}

func (s *Supervisor) getAgent(name string) (agent.Agent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.agentByNameLocked(name)
	if err != nil {
		return agent.Agent{}, err
	}
	return *a, nil
}

func (s *Supervisor) listAgents() []agent.Agent {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]agent.Agent, 0, len(s.agents))
	for _, a := range s.agents {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// checkStrategy refuses a strategy this daemon cannot run, with the reason.
func (s *Supervisor) checkStrategy(n strategy.Name) error {
	r := s.strategyResult(n)
	if !r.Available {
		return errdefs.FailedPrecondition("execution strategy %s is not available on this daemon: %s", n, r.Reason)
	}
	return nil
}

func (s *Supervisor) createAgent(ctx context.Context, a agent.Agent) (agent.Agent, error) {
	if err := agent.ValidateName(a.Name); err != nil {
		return agent.Agent{}, err
	}
	a.ID = agent.NewID()
	a.CreatedAt = time.Now().UTC()
	a.RunInSandbox = nil
	a.AllowedDomains = withRuntimeDomains(a.AllowedDomains, a.Runtime)
	check := func() error {
		if _, err := s.agentByNameLocked(a.Name); err == nil {
			return errdefs.AlreadyExists("an agent named %q already exists (agent edit changes it)", a.Name)
		}
		if a.Strategy == "" {
			a.Strategy = probe.Default(s.probes)
		}
		if err := agent.Validate(&a, s.opts.Home, s.store.AgentDir(a.ID)); err != nil {
			return err
		}
		if err := s.checkBindings(a); err != nil {
			return err
		}
		if err := s.checkStrategy(a.Strategy); err != nil {
			return fmt.Errorf("agent %s: %w", a.Name, err)
		}
		return nil
	}
	s.mu.Lock()
	err := check()
	s.mu.Unlock()
	if err != nil {
		return agent.Agent{}, err
	}
	// A runtime is installed (once, minutes at most) before the agent
	// exists, outside the lock; then everything is checked again.
	if err := s.installRuntime(ctx, a.Runtime); err != nil {
		return agent.Agent{}, fmt.Errorf("agent %s: %w", a.Name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := check(); err != nil {
		return agent.Agent{}, err
	}
	if err := s.store.Create(&a); err != nil {
		return agent.Agent{}, err
	}
	s.agents[a.ID] = &a
	if warmable(a) {
		s.fillWarm(a.ID)
	}
	s.events.add(event{Type: "agent.created", Agent: a.Name, Message: "strategy " + string(a.Strategy)})
	s.log.WithFields(map[string]any{"agent": a.Name, "strategy": a.Strategy}).Info("agent created")
	return a, nil
}

// installRuntime puts the known runtime name in the cache unless it is
// there; an empty name is no runtime.
func (s *Supervisor) installRuntime(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}
	if _, ok := s.runtimes.Get(name); ok {
		return nil
	}
	s.log.WithField("runtime", name).Info("installing the runtime for an agent")
	in, err := s.runtimes.Install(ctx, name, false)
	if err != nil {
		return err
	}
	s.events.add(event{Type: "runtime.installed", Message: in.Name + " " + in.Version})
	return nil
}

// withRuntimeDomains adds the hosts runtime's API and login need to
// domains, those not there already.
func withRuntimeDomains(domains []string, runtime string) []string {
	for _, d := range runtimes.Known[runtime].Domains {
		if !slices.Contains(domains, d) {
			domains = append(domains, d)
		}
	}
	return domains
}

// updateAgent replaces the settings of the agent called name with a's. Its
// id, directory and creation time stay; running sessions keep the settings
// they started with. A runtime it did not have is installed first.
func (s *Supervisor) updateAgent(ctx context.Context, name string, a agent.Agent) (agent.Agent, error) {
	var old *agent.Agent
	check := func() error {
		var err error
		if old, err = s.agentByNameLocked(name); err != nil {
			return err
		}
		if a.Name != name {
			if err := agent.ValidateName(a.Name); err != nil {
				return err
			}
			if _, err := s.agentByNameLocked(a.Name); err == nil {
				return errdefs.AlreadyExists("an agent named %q already exists", a.Name)
			}
		}
		a.ID, a.CreatedAt, a.RunInSandbox = old.ID, old.CreatedAt, nil
		if a.Strategy == "" {
			a.Strategy = old.Strategy
		}
		if err := agent.Validate(&a, s.opts.Home, s.store.AgentDir(a.ID)); err != nil {
			return err
		}
		if err := s.checkBindings(a); err != nil {
			return err
		}
		if a.Strategy != old.Strategy {
			if err := s.checkStrategy(a.Strategy); err != nil {
				return fmt.Errorf("agent %s: %w", a.Name, err)
			}
		}
		return nil
	}
	s.mu.Lock()
	err := check()
	newRuntime := err == nil && a.Runtime != old.Runtime
	s.mu.Unlock()
	if err != nil {
		return agent.Agent{}, err
	}
	if newRuntime {
		a.AllowedDomains = withRuntimeDomains(a.AllowedDomains, a.Runtime)
		if err := s.installRuntime(ctx, a.Runtime); err != nil {
			return agent.Agent{}, fmt.Errorf("agent %s: %w", a.Name, err)
		}
	}
	if err := s.saveUpdate(old, &a, check); err != nil {
		return agent.Agent{}, err
	}
	// Its warm boundaries were built from what it was.
	s.drainWarm(a.ID)
	if warmable(a) {
		s.fillWarm(a.ID)
	}
	s.events.add(event{Type: "agent.updated", Agent: a.Name})
	s.log.WithField("agent", a.Name).Info("agent updated")
	return a, nil
}

// saveUpdate checks and saves a, then makes it the agent *old is.
func (s *Supervisor) saveUpdate(old, a *agent.Agent, check func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := check(); err != nil {
		return err
	}
	if err := s.store.EnsureWorkspace(a); err != nil {
		return errdefs.InvalidArgument("%v", err)
	}
	if err := s.store.Save(a); err != nil {
		return err
	}
	*old = *a
	return nil
}

// deleteAgent removes an agent and its sessions; it refuses while one runs
// or is being started (see startSession).
func (s *Supervisor) deleteAgent(name string) error {
	s.mu.Lock()
	a, err := s.agentByNameLocked(name)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if s.starting[a.ID] > 0 {
		s.mu.Unlock()
		return errdefs.FailedPrecondition("agent %s has a session starting: stop it once it has started, then remove the agent", name)
	}
	var owned []*sessionState
	for _, ss := range s.sessions {
		if ss.agentID() == a.ID {
			if ss.isRunning() {
				s.mu.Unlock()
				return errdefs.FailedPrecondition("agent %s has running sessions (%s...): stop them first", name, ss.id)
			}
			owned = append(owned, ss)
		}
	}
	delete(s.agents, a.ID)
	s.mu.Unlock()
	// Its warm boundaries go, and a build in flight ends before the
	// agent's directory does (it would make the directories again).
	s.drainWarm(a.ID)
	s.waitFilled(a.ID)

	var errs []error
	for _, ss := range owned {
		if err := s.removeSession(ss.id, false); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if err := s.store.Remove(a.ID); err != nil {
		errs = append(errs, err)
	}
	s.events.add(event{Type: "agent.removed", Agent: name})
	s.log.WithField("agent", name).Info("agent removed")
	return errors.Join(errs...)
}

// offered says whether sessions of a can run here, and if not, why: its
// strategy is not offered, or its runtime refuses to run as this daemon
// would run it.
func (s *Supervisor) offered(a agent.Agent) (bool, string) {
	if r := s.strategyResult(a.Strategy); !r.Available {
		return false, NotOffered + " " + r.Reason
	}
	if why := s.refusesRoot(a); why != "" {
		return false, "Its sessions are refused: " + why
	}
	return true, ""
}
