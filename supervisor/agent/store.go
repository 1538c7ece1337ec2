package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
)

// Store keeps agents in <home>/agents/<id>/. It does no locking: the
// supervisor serializes changes.
type Store struct {
	Dir string
}

// NewID returns a random agent or session id: 16 hex digits.
func NewID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// AgentDir is the directory of the agent with id.
func (s Store) AgentDir(id string) string { return filepath.Join(s.Dir, id) }

// Create makes the agent's directories and saves it. On failure nothing of
// it is left.
func (s Store) Create(a *Agent) (retErr error) {
	dir := s.AgentDir(a.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create agent %s: %w", a.Name, err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	for _, d := range []string{HomeDir, MemoryDir, TmpDir} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return fmt.Errorf("create agent %s: %w", a.Name, err)
		}
	}
	if err := s.EnsureWorkspace(a); err != nil {
		return err
	}
	return s.Save(a)
}

// EnsureWorkspace creates the workspace of an agent that keeps it in its own
// directory, after checking again that it resolves inside.
func (s Store) EnsureWorkspace(a *Agent) error {
	if a.SharedWorkspace != "" {
		return nil
	}
	ws, err := ResolveInside(s.AgentDir(a.ID), a.Workspace)
	if err != nil {
		return fmt.Errorf("agent %s: workspace %s: %w", a.Name, a.Workspace, err)
	}
	if err := os.MkdirAll(ws, 0o700); err != nil {
		return fmt.Errorf("agent %s: create workspace: %w", a.Name, err)
	}
	return nil
}

// Save writes agent.json atomically.
func (s Store) Save(a *Agent) error {
	return atomicfile.WriteJSON(filepath.Join(s.AgentDir(a.ID), File), a, 0o600)
}

// Load reads every agent. An agent.json that cannot be read is reported in
// problems and skipped, so that one bad file does not stop the daemon.
func (s Store) Load() (agents []*Agent, problems []error, err error) {
	entries, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read agents: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		var a Agent
		if err := atomicfile.ReadJSON(filepath.Join(s.Dir, e.Name(), File), &a); err != nil {
			problems = append(problems, fmt.Errorf("agent %s: %w", e.Name(), err))
			continue
		}
		if a.ID != e.Name() {
			problems = append(problems, fmt.Errorf("agent %s: agent.json names id %q", e.Name(), a.ID))
			continue
		}
		agents = append(agents, &a)
	}
	return agents, problems, nil
}

// Remove deletes the agent's directory: renamed away first, so a crash
// midway never leaves a half-deleted agent that looks whole.
func (s Store) Remove(id string) error {
	dir := s.AgentDir(id)
	trash := filepath.Join(s.Dir, ".removing-"+id)
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("remove agent: %w", err)
	}
	return os.RemoveAll(trash)
}

// CleanTrash finishes removals a crash interrupted.
func (s Store) CleanTrash() {
	entries, _ := os.ReadDir(s.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".removing-") {
			os.RemoveAll(filepath.Join(s.Dir, e.Name()))
		}
	}
}
