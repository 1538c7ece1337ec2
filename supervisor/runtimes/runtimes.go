// Package runtimes keeps the daemon-wide cache of the known ACP runtimes:
// each one's adapter from npm at the version this release pins, installed
// outside every boundary into a directory named by the digest of its
// package-lock.json (which pins every dependency by its integrity hash), so
// that one tree serves every agent and session of that runtime, read-only.
package runtimes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// Runtime is a known ACP runtime: its npm package at the pinned version,
// and the command that starts its ACP side, relative to the installed tree.
type Runtime struct {
	Name    string
	Package string
	Version string
	// Entry is the program to run, relative to the tree; Args follow it.
	Entry string
	Args  []string
	// Env is set for every run, under the agent's own variables: the tree
	// is read-only, so nothing may try to update it, and the boundary
	// would refuse the runtime's telemetry hosts anyway.
	Env []string
	// Domains are the hosts its model API and login need, added to the
	// allowed domains of an agent made with it (agent edit removes them).
	Domains []string
	// Auth is the ACP authentication method chat uses before session/new
	// (an API key in the environment); empty: none needed.
	Auth string
	// VMEnv is set in microsandbox too, under Env: where the guest's
	// shares (virtiofs without a cache: no shared mmap) would not do.
	VMEnv []string
	// RefusesRoot, when set, says why the runtime does not start as uid 0
	// outside a sandbox, and RootSwitch is the variable that tells it it is
	// in one anyway.
	RefusesRoot, RootSwitch string
}

// Known are the runtimes this release knows, by name.
var Known = map[string]Runtime{
	"claude": {Name: "claude", Package: "@zed-industries/claude-agent-acp", Version: "0.23.1", Entry: "node_modules/.bin/claude-agent-acp",
		Env:         []string{"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"},
		Domains:     []string{"api.anthropic.com", "platform.claude.com", "console.anthropic.com"},
		RefusesRoot: "Claude Code refuses to run as root with --dangerously-skip-permissions, which claude-agent-acp passes",
		RootSwitch:  "IS_SANDBOX"},
	"codex": {Name: "codex", Package: "@zed-industries/codex-acp", Version: "0.16.0", Entry: "node_modules/.bin/codex-acp",
		Domains: []string{"api.openai.com", "chatgpt.com", "auth.openai.com"}, Auth: "openai-api-key"},
	"gemini": {Name: "gemini", Package: "@google/gemini-cli", Version: "0.61.0", Entry: "node_modules/.bin/gemini", Args: []string{"--experimental-acp"},
		Domains: []string{"generativelanguage.googleapis.com", "cloudcode-pa.googleapis.com", "oauth2.googleapis.com"}, Auth: "gemini-api-key"},
	"opencode": {Name: "opencode", Package: "opencode-ai", Version: "1.18.33", Entry: "node_modules/.bin/opencode", Args: []string{"acp"},
		Env: []string{"OPENCODE_DISABLE_AUTOUPDATE=1"},
		// Its SQLite database in WAL mode needs shared mmap, which the VM's
		// share of the agent's home does not have: VM-local instead (kept
		// across stop and resume, reset with the VM).
		VMEnv: []string{"XDG_DATA_HOME=/var/lib/agentconnect/data"}},
}

// MountRoot is where srt and microsandbox show a runtime's tree, read-only:
// MountRoot/<name>. The guest image keeps its own trees at the same place.
const MountRoot = "/opt/agentconnect/runtimes"

// Target is where runtime name's tree is inside a boundary.
func Target(name string) string { return MountRoot + "/" + name }

// Command is the command line of r run from its tree at root, with extra
// (the agent's own arguments) after its own.
func (r Runtime) Command(root string, extra []string) []string {
	cmd := append([]string{root + "/" + r.Entry}, r.Args...)
	return append(cmd, extra...)
}

// Names lists the known runtimes, sorted.
func Names() []string {
	names := make([]string, 0, len(Known))
	for n := range Known {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Installed is a runtime in the cache.
type Installed struct {
	Name        string    `json:"name"`
	Package     string    `json:"package"`
	Version     string    `json:"version"`
	Digest      string    `json:"digest"` // sha256 of its package-lock.json
	InstalledAt time.Time `json:"installedAt"`
}

// installTimeout bounds one npm install.
const installTimeout = 10 * time.Minute

// Cache is the runtime cache in a directory of the daemon's home:
// store/sha256-<digest>/ for each tree, <name>.json for the tree each
// runtime uses. It is safe for concurrent use.
type Cache struct {
	dir string
	// NPM runs npm; nil means the npm on PATH.
	NPM func(ctx context.Context, dir string, args ...string) ([]byte, error)

	mu sync.Mutex // one install at a time: npm's own cache is shared
}

// Open is the cache at dir (created on the first install).
func Open(dir string) *Cache { return &Cache{dir: dir} }

// Dir is where an installed runtime's tree is.
func (c *Cache) Dir(in Installed) string {
	return filepath.Join(c.dir, "store", "sha256-"+in.Digest)
}

// Get is the installed runtime name, if it is installed.
func (c *Cache) Get(name string) (Installed, bool) {
	var in Installed
	if err := atomicfile.ReadJSON(filepath.Join(c.dir, name+".json"), &in); err != nil {
		return Installed{}, false
	}
	if _, err := os.Stat(filepath.Join(c.Dir(in), Known[name].Entry)); err != nil {
		return Installed{}, false // a tree removed by hand is not installed
	}
	return in, true
}

// Install puts runtime name at its pinned version in the cache, unless it
// is there already (again when force: update). What a failed install
// wrote is removed; the runtime's previous tree stays in use.
func (c *Cache) Install(ctx context.Context, name string, force bool) (Installed, error) {
	r, ok := Known[name]
	if !ok {
		return Installed{}, errdefs.InvalidArgument("no runtime %q (known: %s); any other ACP command runs as agent create NAME -- COMMAND", name, strings.Join(Names(), ", "))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in, ok := c.Get(name); ok && in.Version == r.Version && !force {
		return in, nil
	}
	if err := os.MkdirAll(filepath.Join(c.dir, "store"), 0o755); err != nil {
		return Installed{}, fmt.Errorf("runtime cache: %w", err)
	}
	tmp, err := os.MkdirTemp(c.dir, ".install-"+name+"-")
	if err != nil {
		return Installed{}, fmt.Errorf("runtime cache: %w", err)
	}
	defer os.RemoveAll(tmp) // gone once renamed
	// MkdirTemp's 0700 would keep the tree from any other account: a host
	// run as sandbox.host.user reads it too.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Installed{}, fmt.Errorf("runtime cache: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, installTimeout)
	defer cancel()
	npm := c.NPM
	if npm == nil {
		npm = runNPM
	}
	if out, err := npm(ctx, tmp, "install", "--no-audit", "--no-fund", "--no-update-notifier", "--prefix", tmp, r.Package+"@"+r.Version); err != nil {
		return Installed{}, fmt.Errorf("npm install %s@%s: %w: %s", r.Package, r.Version, err, lastLines(out, 5))
	}
	if _, err := os.Stat(filepath.Join(tmp, r.Entry)); err != nil {
		return Installed{}, fmt.Errorf("npm install %s@%s left no %s", r.Package, r.Version, r.Entry)
	}
	lock, err := os.ReadFile(filepath.Join(tmp, "package-lock.json"))
	if err != nil {
		return Installed{}, fmt.Errorf("npm install %s@%s wrote no package-lock.json: %w", r.Package, r.Version, err)
	}
	digest, err := lockDigest(lock)
	if err != nil {
		return Installed{}, fmt.Errorf("npm install %s@%s: package-lock.json: %w", r.Package, r.Version, err)
	}
	in := Installed{Name: name, Package: r.Package, Version: r.Version, Digest: digest, InstalledAt: time.Now().UTC()}
	// A tree in the store already for the same lock is the same tree:
	// rename's EEXIST or ENOTEMPTY (both fs.ErrExist) keeps it.
	if err := os.Rename(tmp, c.Dir(in)); err != nil && !errors.Is(err, fs.ErrExist) {
		return Installed{}, fmt.Errorf("runtime cache: %w", err)
	}
	// Its files read-only from here: every session shares the tree (and
	// mounts it read-only). Directories stay the owner's, so that the
	// daemon's user can remove the tree.
	filepath.WalkDir(c.Dir(in), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				os.Chmod(p, fi.Mode().Perm()&^0o222)
			}
		}
		return nil
	})
	if err := atomicfile.WriteJSON(filepath.Join(c.dir, name+".json"), in, 0o644); err != nil {
		return Installed{}, fmt.Errorf("runtime cache: %w", err)
	}
	return in, nil
}

// OpenTrees lets every account read the cached trees and reach them
// (trees that releases before this one made 0700): they are npm packages,
// nothing private, and a host run as sandbox.host.user runs them.
func (c *Cache) OpenTrees() error {
	dirs := []string{c.dir, filepath.Join(c.dir, "store")}
	for _, name := range Names() {
		if in, ok := c.Get(name); ok {
			dirs = append(dirs, c.Dir(in))
		}
	}
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o055 != 0o055 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o055); err != nil {
				return err
			}
		}
	}
	return nil
}

// lockDigest is the sha256 of a package-lock.json without the names npm
// gives the root package (the install directory's), in a canonical form:
// the same dependencies at the same integrity hashes are the same tree.
func lockDigest(lock []byte) (string, error) {
	var doc map[string]any
	if err := json.Unmarshal(lock, &doc); err != nil {
		return "", err
	}
	delete(doc, "name")
	if pkgs, ok := doc["packages"].(map[string]any); ok {
		if root, ok := pkgs[""].(map[string]any); ok {
			delete(root, "name")
		}
	}
	canon, err := json.Marshal(doc) // map keys sorted
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}

func runNPM(ctx context.Context, dir string, args ...string) ([]byte, error) {
	path, err := exec.LookPath("npm")
	if err != nil {
		return nil, errdefs.FailedPrecondition("npm is not installed for the daemon's user: install it (apt-get install npm), then runtime install again")
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}
