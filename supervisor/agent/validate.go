package agent

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

var (
	// Compiled when first used: a counted repetition compiles to a large
	// program (~0.1 ms each), which every CLI command paid at its start.
	namePattern   = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	envKeyPattern = lazyRegexp(`^[A-Za-z_][A-Za-z0-9_]*$`)
	labelPattern  = lazyRegexp(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// reservedEnv are set by the daemon for every session.
var reservedEnv = map[string]string{
	"HOME":   "the agent's private runtime home",
	"TMPDIR": "the agent's private tmp",
}

// protectedTargets may not be covered by a mount: the kernel's views, and
// the root itself.
var protectedTargets = []string{"/", "/proc", "/sys", "/dev"}

// ValidName reports whether name is a good name for an agent or a secret:
// 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit.
func ValidName(name string) bool { return namePattern().MatchString(name) }

// ValidateName checks an agent name.
func ValidateName(name string) error {
	if !namePattern().MatchString(name) {
		return errdefs.InvalidArgument("agent name %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Validate checks every setting of a, for a daemon whose home is daemonHome
// and where a's directory is agentDir. It fills in defaults (the workspace)
// and cleans paths, so a saved agent is in its canonical form.
func Validate(a *Agent, daemonHome, agentDir string) error {
	if err := ValidateName(a.Name); err != nil {
		return err
	}
	if a.Strategy != "" {
		if _, err := strategy.Parse(string(a.Strategy)); err != nil {
			return errdefs.InvalidArgument("agent %s: %v", a.Name, err)
		}
	}
	if a.Runtime != "" {
		if _, ok := runtimes.Known[a.Runtime]; !ok {
			return errdefs.InvalidArgument("agent %s: --runtime %q: no such runtime (known: %s); any other ACP command runs as agent create %s -- COMMAND",
				a.Name, a.Runtime, strings.Join(runtimes.Names(), ", "), a.Name)
		}
		if len(a.Command) > 0 {
			return errdefs.InvalidArgument("agent %s: both a command and --runtime %s: the arguments after -- are the runtime's extra arguments (runtimeArgs)", a.Name, a.Runtime)
		}
	} else {
		if len(a.Command) == 0 || a.Command[0] == "" {
			return errdefs.InvalidArgument("agent %s: empty command: name a known runtime with --runtime (%s), or give the runtime to run after --, for example: agent create %s -- my-acp-runtime",
				a.Name, strings.Join(runtimes.Names(), ", "), a.Name)
		}
		if len(a.RuntimeArgs) > 0 {
			return errdefs.InvalidArgument("agent %s: runtimeArgs without a runtime: put them in the command", a.Name)
		}
	}
	for _, arg := range append(slices.Clone(a.Command), a.RuntimeArgs...) {
		if strings.ContainsRune(arg, 0) {
			return errdefs.InvalidArgument("agent %s: command argument contains a NUL byte", a.Name)
		}
	}
	for _, kv := range a.Env {
		if err := validateEnv(kv); err != nil {
			return errdefs.InvalidArgument("agent %s: %v", a.Name, err)
		}
	}
	for _, c := range a.AllowCredentials {
		if _, ok := Credentials[c]; !ok {
			names := make([]string, 0, len(Credentials))
			for n := range Credentials {
				names = append(names, n)
			}
			sort.Strings(names)
			return errdefs.InvalidArgument("agent %s: --allow-credential %q: no such credential (known: %s)", a.Name, c, strings.Join(names, ", "))
		}
	}
	if err := validateSecrets(a); err != nil {
		return errdefs.InvalidArgument("agent %s: %v", a.Name, err)
	}
	if err := validateLogin(a.Login); err != nil {
		return errdefs.InvalidArgument("agent %s: login: %v", a.Name, err)
	}
	if err := validateWorkspace(a, daemonHome, agentDir); err != nil {
		return err
	}
	for i := range a.Mounts {
		if err := validateMount(&a.Mounts[i], daemonHome); err != nil {
			return errdefs.InvalidArgument("agent %s: %v", a.Name, err)
		}
	}
	for _, list := range [][]string{a.AllowedDomains, a.DeniedDomains} {
		for i, d := range list {
			clean, err := ValidateDomain(d)
			if err != nil {
				return errdefs.InvalidArgument("agent %s: %v", a.Name, err)
			}
			list[i] = clean
		}
	}
	if err := validateWarm(a); err != nil {
		return err
	}
	return validateResources(a.Name, a.Resources)
}

// validateSecrets checks the bindings' form; that each secret exists is
// the daemon's check, which has the store.
func validateSecrets(a *Agent) error {
	plain := map[string]bool{}
	for _, kv := range a.Env {
		k, _, _ := strings.Cut(kv, "=")
		plain[k] = true
	}
	seen := map[string]bool{}
	for _, b := range a.Secrets {
		if !envKeyPattern().MatchString(b.Env) {
			return fmt.Errorf("secret binding %s=%s: %q is not a variable name", b.Env, b.Secret, b.Env)
		}
		if what, ok := reservedEnv[b.Env]; ok {
			return fmt.Errorf("secret binding %s: the daemon sets %s to %s", b.Env, b.Env, what)
		}
		if plain[b.Env] {
			return fmt.Errorf("%s is both a plain --env and a --secret binding: keep one", b.Env)
		}
		if seen[b.Env] {
			return fmt.Errorf("%s is bound to a secret twice", b.Env)
		}
		seen[b.Env] = true
		if !ValidName(b.Secret) {
			return fmt.Errorf("secret binding %s=%s: %q is not a secret name", b.Env, b.Secret, b.Secret)
		}
	}
	return nil
}

// ParseSecretBinding reads --secret ENV_VAR=NAME.
func ParseSecretBinding(s string) (SecretBinding, error) {
	env, name, ok := strings.Cut(s, "=")
	if !ok || env == "" || name == "" {
		return SecretBinding{}, errdefs.InvalidArgument("--secret %q: want ENV_VAR=SECRET_NAME, for example ANTHROPIC_API_KEY=claude", s)
	}
	return SecretBinding{Env: env, Secret: name}, nil
}

func validateEnv(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	if !ok {
		return fmt.Errorf("env %q: want KEY=VALUE", kv)
	}
	if !envKeyPattern().MatchString(k) {
		return fmt.Errorf("env %q: %q is not a variable name", kv, k)
	}
	if what, ok := reservedEnv[k]; ok {
		return fmt.Errorf("env %s: the daemon sets %s to %s", k, k, what)
	}
	if strings.ContainsRune(kv, 0) {
		return fmt.Errorf("env %s: value contains a NUL byte", k)
	}
	return nil
}

func validateWorkspace(a *Agent, daemonHome, agentDir string) error {
	if a.SharedWorkspace != "" {
		if a.Workspace != "" && a.Workspace != DefaultWorkspace {
			return errdefs.InvalidArgument("agent %s: give --workspace or --shared-workspace, not both", a.Name)
		}
		a.Workspace = ""
		dir, err := existingOutside(a.SharedWorkspace, daemonHome, "shared workspace")
		if err != nil {
			return errdefs.InvalidArgument("agent %s: %v", a.Name, err)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return errdefs.InvalidArgument("agent %s: shared workspace %s is not a directory", a.Name, a.SharedWorkspace)
		}
		if dir == "/" {
			return errdefs.InvalidArgument("agent %s: shared workspace cannot be /", a.Name)
		}
		a.SharedWorkspace = dir
		return nil
	}
	ws := a.Workspace
	if ws == "" {
		ws = DefaultWorkspace
	}
	if filepath.IsAbs(ws) {
		rel, err := filepath.Rel(agentDir, filepath.Clean(ws))
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return errdefs.InvalidArgument("agent %s: workspace %s is outside the agent directory %s (declare a host directory with --shared-workspace)", a.Name, ws, agentDir)
		}
		ws = rel
	}
	ws = filepath.Clean(ws)
	first, _, _ := strings.Cut(ws, string(filepath.Separator))
	if ws == "." || ws == ".." || strings.HasPrefix(ws, "../") || first == File {
		return errdefs.InvalidArgument("agent %s: workspace %q must be a directory inside the agent directory (declare a host directory with --shared-workspace)", a.Name, a.Workspace)
	}
	if _, err := ResolveInside(agentDir, ws); err != nil {
		return errdefs.InvalidArgument("agent %s: workspace %q: %v (declare a host directory with --shared-workspace)", a.Name, ws, err)
	}
	a.Workspace = ws
	return nil
}

// ResolveInside resolves rel under root, following symlinks in the part
// that exists, and fails when the result is not inside root.
func ResolveInside(root, rel string) (string, error) {
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		// The agent directory may not exist yet (validating a new agent):
		// then nothing under it can be a symlink.
		realRoot = filepath.Clean(root)
	}
	full := filepath.Join(realRoot, rel)
	existing, rest := full, ""
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		parent := filepath.Dir(existing)
		if parent == existing {
			break
		}
		rest = filepath.Join(filepath.Base(existing), rest)
		existing = parent
	}
	resolved, err := filepath.EvalSymlinks(existing)
	if err != nil {
		return "", fmt.Errorf("resolve %s: %w", full, err)
	}
	resolved = filepath.Join(resolved, rest)
	if !Within(realRoot, resolved) || resolved == realRoot {
		return "", fmt.Errorf("resolves to %s, outside %s", resolved, root)
	}
	return resolved, nil
}

// Within reports whether path is dir or below it.
func Within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// existingOutside resolves path, which must exist, and refuses it when it is
// inside the daemon home or contains it: the home holds every agent's and
// session's state, and no boundary may see it.
func existingOutside(path, daemonHome, what string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s %q: want an absolute path", what, path)
	}
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, unwrapPathError(err))
	}
	realHome, err := filepath.EvalSymlinks(daemonHome)
	if err != nil {
		realHome = filepath.Clean(daemonHome)
	}
	if Within(realHome, resolved) {
		return "", fmt.Errorf("%s %s is inside the daemon home %s, which no boundary may see", what, path, daemonHome)
	}
	if Within(resolved, realHome) {
		return "", fmt.Errorf("%s %s contains the daemon home %s, which no boundary may see", what, path, daemonHome)
	}
	return resolved, nil
}

func unwrapPathError(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func validateMount(m *Mount, daemonHome string) error {
	src, err := existingOutside(m.Source, daemonHome, "mount source")
	if err != nil {
		return err
	}
	if !filepath.IsAbs(m.Target) {
		return fmt.Errorf("mount target %q: want an absolute path", m.Target)
	}
	target := filepath.Clean(m.Target)
	for _, p := range protectedTargets {
		if target == p || (p != "/" && Within(p, target)) {
			return fmt.Errorf("mount target %s: may not cover %s", m.Target, p)
		}
	}
	if Within(filepath.Clean(daemonHome), target) {
		return fmt.Errorf("mount target %s: may not cover the daemon home", m.Target)
	}
	m.Source, m.Target = src, target
	return nil
}

// ParseMount reads a --mount flag: SRC:DST[:ro|rw], or the long form
// type=bind,src=S,dst=D[,readonly]. Mounts are read-only unless rw is given.
func ParseMount(s string) (Mount, error) {
	if strings.Contains(s, "=") {
		return parseLongMount(s)
	}
	parts := strings.Split(s, ":")
	m := Mount{ReadOnly: true}
	switch len(parts) {
	case 3:
		switch parts[2] {
		case "ro":
		case "rw":
			m.ReadOnly = false
		default:
			return Mount{}, fmt.Errorf("mount %q: mode %q: want ro or rw", s, parts[2])
		}
		fallthrough
	case 2:
		m.Source, m.Target = parts[0], parts[1]
	default:
		return Mount{}, fmt.Errorf("mount %q: want SRC:DST[:ro|rw] or type=bind,src=S,dst=D[,readonly]", s)
	}
	if m.Source == "" || m.Target == "" {
		return Mount{}, fmt.Errorf("mount %q: source and target are both needed", s)
	}
	return m, nil
}

func parseLongMount(s string) (Mount, error) {
	m := Mount{ReadOnly: true}
	rw := false
	for _, field := range strings.Split(s, ",") {
		k, v, hasValue := strings.Cut(field, "=")
		switch k {
		case "type":
			if v != "bind" {
				return Mount{}, fmt.Errorf("mount %q: type %q: only bind mounts are supported", s, v)
			}
		case "src", "source":
			m.Source = v
		case "dst", "destination", "target":
			m.Target = v
		case "readonly", "ro":
			if hasValue {
				b, err := strconv.ParseBool(v)
				if err != nil {
					return Mount{}, fmt.Errorf("mount %q: %s=%q: want true or false", s, k, v)
				}
				rw = !b
			}
		case "rw":
			rw = true
		default:
			return Mount{}, fmt.Errorf("mount %q: unknown field %q", s, k)
		}
	}
	m.ReadOnly = !rw
	if m.Source == "" || m.Target == "" {
		return Mount{}, fmt.Errorf("mount %q: src and dst are both needed", s)
	}
	return m, nil
}

// ValidateDomain checks a network policy entry: a host name, *.name for
// its subdomains, or an IP address, each with an optional :port. It returns
// the entry in lower case.
func ValidateDomain(d string) (string, error) {
	entry := strings.ToLower(strings.TrimSpace(d))
	host, port := entry, ""
	if h, p, err := net.SplitHostPort(entry); err == nil {
		host, port = h, p
	} else if strings.HasPrefix(entry, "[") {
		return "", fmt.Errorf("domain %q: want [IPv6]:port", d)
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("domain %q: port %q: want 1 to 65535", d, port)
		}
	}
	if net.ParseIP(host) != nil {
		return entry, nil
	}
	name := strings.TrimPrefix(host, "*.")
	labels := strings.Split(name, ".")
	if name == "" || len(name) > 253 {
		return "", fmt.Errorf("domain %q: want a host name such as example.com or *.example.com", d)
	}
	for _, l := range labels {
		if !labelPattern().MatchString(l) {
			return "", fmt.Errorf("domain %q: want a host name such as example.com or *.example.com", d)
		}
	}
	return entry, nil
}

// MaxWarm bounds an agent's warm boundaries: each is a shim kept alive
// with its sandbox (srt) or its booted VM (microsandbox, memoryMiB each).
const MaxWarm = 16

// validateWarm checks the warm boundaries a asks for.
func validateWarm(a *Agent) error {
	if a.Warm < 0 || a.Warm > MaxWarm {
		return errdefs.InvalidArgument("agent %s: warm %d: want 0 to %d", a.Name, a.Warm, MaxWarm)
	}
	return nil
}

func validateResources(name string, r Resources) error {
	check := func(what string, v, lo, hi int) error {
		if v != 0 && (v < lo || v > hi) {
			return errdefs.InvalidArgument("agent %s: %s %d: want %d to %d (or 0 for the default)", name, what, v, lo, hi)
		}
		return nil
	}
	for _, c := range []error{
		check("cpus", r.CPUs, 1, 256),
		check("memoryMiB", r.MemoryMiB, 32, 1<<20),
		check("diskGiB", r.DiskGiB, 1, 16384),
		check("pids", r.Pids, 16, 1<<22),
	} {
		if c != nil {
			return c
		}
	}
	return nil
}

// lazyRegexp is expr compiled on first use.
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}
