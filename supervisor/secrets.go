package supervisor

import (
	"sort"
	"strings"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/secret"
)

// setSecret adds or replaces a secret. Sessions running keep what they
// started with; the next run of a bound agent gets the new value.
func (s *Supervisor) setSecret(sec secret.Secret) (secret.Secret, error) {
	saved, err := s.secrets.Set(sec)
	if err != nil {
		return secret.Secret{}, err
	}
	s.events.add(event{Type: "secret.set", Message: saved.Name + " for " + strings.Join(saved.Hosts, ", ")})
	s.log.WithFields(map[string]any{"secret": saved.Name, "hosts": saved.Hosts}).Info("secret set")
	return saved, nil
}

// secretUsers maps each secret name to the agents bound to it, sorted.
func (s *Supervisor) secretUsers() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.secretUsersLocked()
}

func (s *Supervisor) secretUsersLocked() map[string][]string {
	users := map[string][]string{}
	for _, a := range s.agents {
		for _, b := range a.Secrets {
			users[b.Secret] = append(users[b.Secret], a.Name)
		}
	}
	for _, names := range users {
		sort.Strings(names)
	}
	return users
}

// removeSecret deletes a secret; while agents are bound to it only with
// force (their sessions then refuse to start until it is set again). s.mu
// is held throughout, so that no agent is bound to it in between.
func (s *Supervisor) removeSecret(name string, force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if users := s.secretUsersLocked()[name]; len(users) > 0 && !force {
		return errdefs.FailedPrecondition("secret %s is bound to agent %s: change those agents first (agent edit ... --secret), or remove it anyway with --force", name, strings.Join(users, ", "))
	}
	if err := s.secrets.Remove(name); err != nil {
		return err
	}
	s.events.add(event{Type: "secret.removed", Message: name})
	s.log.WithField("secret", name).Info("secret removed")
	return nil
}

// checkBindings refuses an agent bound to a secret the store lacks.
func (s *Supervisor) checkBindings(a agent.Agent) error {
	for _, b := range a.Secrets {
		if _, ok := s.secrets.Get(b.Secret); !ok {
			return errdefs.NotFound("agent %s: %s is bound to secret %q, which does not exist: set it first (agentconnect secret set %s --host HOST < value)", a.Name, b.Env, b.Secret, b.Secret)
		}
	}
	return nil
}

// runSecrets is what a run gets of the shim's memory only, never
// session.json: variables (the values on host) and, inside a boundary, the
// bindings its proxy swaps.
type runSecrets struct {
	env      []string
	bindings []*shimv1.Secret
}

// secretEnv is what a run of a gets for its bindings: the variables for
// session.json (placeholders inside a boundary; none on host), and what
// only the shim's memory may hold.
func (s *Supervisor) secretEnv(a agent.Agent) (recorded []string, private runSecrets, err error) {
	for _, b := range a.Secrets {
		sec, ok := s.secrets.Get(b.Secret)
		if !ok {
			return nil, runSecrets{}, errdefs.FailedPrecondition("agent %s: %s is bound to secret %q, which was removed: set it again (agentconnect secret set %s ...) or unbind it (agent edit)", a.Name, b.Env, b.Secret, b.Secret)
		}
		if a.Strategy == strategy.Host {
			// No boundary: the runtime is trusted with the value itself.
			private.env = append(private.env, b.Env+"="+string(sec.Value))
			continue
		}
		ph := secret.NewPlaceholder()
		recorded = append(recorded, b.Env+"="+ph)
		private.bindings = append(private.bindings, &shimv1.Secret{Placeholder: ph, Value: string(sec.Value), Hosts: sec.Hosts, Headers: sec.Headers})
	}
	return recorded, private, nil
}

// credentialLayout is where a's secrets are inside its VM (not their
// values, nor their hosts): a change rebuilds the VM, a new value does not.
func credentialLayout(a agent.Agent) []string {
	var layout []string
	for _, b := range a.Secrets {
		layout = append(layout, "env "+b.Env+"="+b.Secret)
	}
	for _, name := range a.AllowCredentials {
		layout = append(layout, "allow "+name)
	}
	sort.Strings(layout)
	return layout
}
