package supervisor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
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
		var names []string
		for _, b := range a.Secrets {
			names = append(names, b.Secret)
		}
		for _, name := range append(names, a.Login.LoginSecrets()...) {
			if !slices.Contains(users[name], a.Name) {
				users[name] = append(users[name], a.Name)
			}
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
	for _, name := range a.Login.LoginSecrets() {
		if _, ok := s.secrets.Get(name); !ok {
			return errdefs.NotFound("agent %s: its login's %s holds secret %q, which does not exist: run agentconnect agent login %s again", a.Name, a.Login.File, name, a.Name)
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
	// login is the runtime's credentials file for the run (placeholders
	// inside a boundary; on host the values), to write into its home.
	login string
}

// secretEnv is what a run of a gets for its bindings: the variables for
// session.json (placeholders inside a boundary; none on host), and what
// only the shim's memory may hold.
func (s *Supervisor) secretEnv(a agent.Agent) (recorded []string, private runSecrets, err error) {
	// bind is what the run holds for a secret: its value on host, else a
	// placeholder, with the binding the proxy swaps it by.
	placeholders := map[string]string{}
	bind := func(name string, missing func() error) (string, error) {
		sec, ok := s.secrets.Get(name)
		if !ok {
			return "", missing()
		}
		if a.Strategy == strategy.Host {
			// No boundary: the runtime is trusted with the value itself.
			return string(sec.Value), nil
		}
		if ph, ok := placeholders[name]; ok {
			return ph, nil
		}
		ph := secret.NewPlaceholder()
		placeholders[name] = ph
		private.bindings = append(private.bindings, &shimv1.Secret{Placeholder: ph, Value: string(sec.Value), Hosts: sec.Hosts, Headers: sec.Headers,
			Name: sec.Name, TokenHosts: sec.TokenHosts, TokenField: sec.TokenField})
		return ph, nil
	}
	for _, b := range a.Secrets {
		v, err := bind(b.Secret, func() error {
			return errdefs.FailedPrecondition("agent %s: %s is bound to secret %q, which was removed: set it again (agentconnect secret set %s ...) or unbind it (agent edit)", a.Name, b.Env, b.Secret, b.Secret)
		})
		if err != nil {
			return nil, runSecrets{}, err
		}
		if a.Strategy == strategy.Host {
			private.env = append(private.env, b.Env+"="+v)
			continue
		}
		recorded = append(recorded, b.Env+"="+v)
	}
	if l := a.Login; l != nil {
		values := map[string]string{}
		for _, name := range l.LoginSecrets() {
			v, err := bind(name, func() error {
				return errdefs.FailedPrecondition("agent %s: its login's secret %q was removed: run agentconnect agent login %s again", a.Name, name, a.Name)
			})
			if err != nil {
				return nil, runSecrets{}, err
			}
			values[name] = v
		}
		private.login = l.Render(func(name string) string { return values[name] })
	}
	return recorded, private, nil
}

// loginSeq tells apart the temporary files of logins written at once.
var loginSeq atomic.Uint64

// writeLogin puts a run's login credentials file into the agent's home,
// where the runtime looks for it (0600, new directories 0700; owner's, the
// account a host run runs as, when it is not nil). The home is
// the boundary's to write, so no symlink is followed on the way: one the
// runtime planted cannot send the write elsewhere.
func writeLogin(home string, l *agent.Login, content string, owner *session.RunAs) error {
	fail := func(err error) error { return fmt.Errorf("the login's %s: %w", l.File, err) }
	dir, err := unix.Open(home, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	defer func() { unix.Close(dir) }()
	if parent := filepath.Dir(l.File); parent != "." {
		for _, name := range strings.Split(parent, "/") {
			err := unix.Mkdirat(dir, name, 0o700)
			if err == nil && owner != nil {
				err = unix.Fchownat(dir, name, int(owner.UID), int(owner.GID), unix.AT_SYMLINK_NOFOLLOW)
			}
			if err != nil && err != unix.EEXIST {
				return fail(err)
			}
			next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fail(fmt.Errorf("%s is not a directory of the agent's home (a symlink?): %w", name, err))
			}
			unix.Close(dir)
			dir = next
		}
	}
	tmp := fmt.Sprintf(".agentconnect-login-%d-%d", os.Getpid(), loginSeq.Add(1))
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fail(err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	if owner != nil {
		err = f.Chown(int(owner.UID), int(owner.GID))
	}
	if err == nil {
		_, err = f.WriteString(content)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dir, tmp, dir, filepath.Base(l.File))
	}
	if err != nil {
		unix.Unlinkat(dir, tmp, 0)
		return fail(err)
	}
	return nil
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
	if l := a.Login; l != nil {
		for _, name := range l.LoginSecrets() {
			layout = append(layout, "file "+l.File+" "+name)
		}
	}
	sort.Strings(layout)
	return layout
}
