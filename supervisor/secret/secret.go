// Package secret is the daemon's secrets store: a value, the hosts allowed
// to receive it, and the request headers it may travel in. Agents bind a
// secret to an environment variable; on host the variable holds the value,
// inside srt and microsandbox a placeholder unique to the session, which
// the session's proxy swaps for the value in requests to the secret's hosts.
//
// The value is kept out of everything but the store's own file: its type
// prints as "[redacted]", the store's errors name secrets and never show
// values, and the file is 0600 in a 0700 directory, written atomically.
package secret

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// Value is a secret's value. Printed with any verb of package fmt (and so
// in a log field or an error), it shows "[redacted]".
type Value string

func (Value) String() string   { return "[redacted]" }
func (Value) GoString() string { return `secret.Value("[redacted]")` }

// Secret is one entry of the store.
type Secret struct {
	Name  string
	Value Value
	// Hosts may receive the value: host names (*.name for subdomains) or IP
	// addresses, each with an optional :port, as in a network policy.
	Hosts []string
	// Headers are the request headers (lower case) the value may be put
	// in; none means any header.
	Headers []string
	// Preset is the preset the hosts and headers came from, if any.
	Preset string
	// TokenHosts renew the value: an OAuth token endpoint, whose answers'
	// field TokenField (access_token, refresh_token or id_token) is its next
	// value. The placeholder goes to them in request bodies too.
	TokenHosts []string
	TokenField string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// TokenFields are the fields of a token endpoint's answer a secret may be
// renewed from.
var TokenFields = []string{"access_token", "refresh_token", "id_token"}

// MaxValue bounds a value: it travels in an environment variable and in
// request headers.
const MaxValue = 16 << 10

// Compiled when first used, not at every CLI start.
var headerPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("^[!#$%&'*+.^_`|~0-9a-z-]{1,64}$") })

// Preset is a service's usual hosts and headers.
type Preset struct {
	Hosts   []string
	Headers []string
}

// Presets name the usual hosts and headers of well-known services.
var Presets = map[string]Preset{
	"anthropic":   {Hosts: []string{"api.anthropic.com"}, Headers: []string{"x-api-key", "authorization"}},
	"openai":      {Hosts: []string{"api.openai.com"}, Headers: []string{"authorization"}},
	"google":      {Hosts: []string{"generativelanguage.googleapis.com"}, Headers: []string{"x-goog-api-key", "authorization"}},
	"github":      {Hosts: []string{"github.com", "api.github.com"}, Headers: []string{"authorization"}},
	"gitlab":      {Hosts: []string{"gitlab.com"}, Headers: []string{"authorization", "private-token"}},
	"huggingface": {Hosts: []string{"huggingface.co"}, Headers: []string{"authorization"}},
	"openrouter":  {Hosts: []string{"openrouter.ai"}, Headers: []string{"authorization"}},
	"npm":         {Hosts: []string{"registry.npmjs.org"}, Headers: []string{"authorization"}},
}

// PresetNames lists the presets, sorted.
func PresetNames() []string {
	names := make([]string, 0, len(Presets))
	for n := range Presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ValidateName checks a secret's name.
func ValidateName(name string) error {
	if !agent.ValidName(name) {
		return errdefs.InvalidArgument("secret name %q: use 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// normalize checks s and puts it in its canonical form: a preset's hosts
// and headers added, hosts and headers in lower case, sorted, once each.
func normalize(s *Secret) error {
	if err := ValidateName(s.Name); err != nil {
		return err
	}
	if s.Value == "" {
		return errdefs.InvalidArgument("secret %s: empty value: give it on stdin or with --from-file", s.Name)
	}
	if len(s.Value) > MaxValue {
		return errdefs.InvalidArgument("secret %s: the value is %d bytes; at most %d fit in an environment variable and a header", s.Name, len(s.Value), MaxValue)
	}
	if strings.ContainsAny(string(s.Value), "\x00\r\n") {
		return errdefs.InvalidArgument("secret %s: the value holds a NUL, CR or LF byte, which no request header can carry", s.Name)
	}
	if s.Preset != "" {
		p, ok := Presets[s.Preset]
		if !ok {
			return errdefs.InvalidArgument("secret %s: no preset %q (presets: %s)", s.Name, s.Preset, strings.Join(PresetNames(), ", "))
		}
		s.Hosts = append(append([]string(nil), p.Hosts...), s.Hosts...)
		s.Headers = append(append([]string(nil), p.Headers...), s.Headers...)
	}
	if len(s.Hosts)+len(s.TokenHosts) == 0 {
		return errdefs.InvalidArgument("secret %s: no host may receive it: name one with --host HOST[:PORT], or use --preset (%s)", s.Name, strings.Join(PresetNames(), ", "))
	}
	if (s.TokenField == "") != (len(s.TokenHosts) == 0) || s.TokenField != "" && !slices.Contains(TokenFields, s.TokenField) {
		return errdefs.InvalidArgument("secret %s: a renewed secret needs --token-host HOST[:PORT] and --token-field, one of %s", s.Name, strings.Join(TokenFields, ", "))
	}
	for _, list := range []*[]string{&s.Hosts, &s.TokenHosts} {
		hosts := make([]string, 0, len(*list))
		for _, h := range *list {
			clean, err := agent.ValidateDomain(h)
			if err != nil {
				return errdefs.InvalidArgument("secret %s: host: %v", s.Name, err)
			}
			hosts = append(hosts, clean)
		}
		*list = sortedUnique(hosts)
	}
	headers := make([]string, 0, len(s.Headers))
	for _, h := range s.Headers {
		clean := strings.ToLower(strings.TrimSpace(h))
		if !headerPattern().MatchString(clean) {
			return errdefs.InvalidArgument("secret %s: header %q is not a header name (for example authorization or x-api-key)", s.Name, h)
		}
		headers = append(headers, clean)
	}
	s.Headers = sortedUnique(headers)
	return nil
}

func sortedUnique(list []string) []string {
	sort.Strings(list)
	out := list[:0]
	for i, v := range list {
		if i == 0 || v != list[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// NewPlaceholder makes the stand-in for a secret's value inside one
// session's boundary: unique to the session, of letters, digits and '-'
// only, so that it survives the encodings a header may wrap it in
// (Basic's base64 among them) and is found again in them.
func NewPlaceholder() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("secret: no randomness: %v", err)) // crypto/rand does not fail on Linux
	}
	return "agentconnect-placeholder-" + hex.EncodeToString(b[:])
}

// file is the store's file: the only place a value is written.
type file struct {
	Secrets []fileSecret `json:"secrets"`
}

type fileSecret struct {
	Name       string    `json:"name"`
	Value      string    `json:"value"`
	Hosts      []string  `json:"hosts"`
	Headers    []string  `json:"headers"`
	Preset     string    `json:"preset,omitempty"`
	TokenHosts []string  `json:"tokenHosts,omitempty"`
	TokenField string    `json:"tokenField,omitempty"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// Store keeps the secrets in one file. It is safe for concurrent use.
type Store struct {
	path string

	mu      sync.Mutex
	secrets map[string]Secret
}

// Open reads the store at path (<home>/secrets/secrets.json); a missing file
// is an empty store. A file that others can read is refused: its values
// may have leaked, and the daemon says so rather than go on.
func Open(path string) (*Store, error) {
	s := &Store{path: path, secrets: map[string]Secret{}}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secrets store: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets store %s is mode %04o, readable beyond the daemon's user: its values may have leaked; rotate them, then chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("secrets store: %w", err)
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		// Not the decoder's message: a syntax error quotes the file.
		return nil, fmt.Errorf("secrets store %s is not valid JSON (at byte %d): restore it from a backup, or remove it and set the secrets again", path, jsonOffset(err))
	}
	for _, fs := range f.Secrets {
		s.secrets[fs.Name] = Secret{
			Name: fs.Name, Value: Value(fs.Value), Hosts: fs.Hosts, Headers: fs.Headers, Preset: fs.Preset,
			TokenHosts: fs.TokenHosts, TokenField: fs.TokenField, CreatedAt: fs.CreatedAt, UpdatedAt: fs.UpdatedAt,
		}
	}
	return s, nil
}

// Set adds or replaces a secret and returns it without its value. Nothing
// changes when it fails.
func (s *Store) Set(sec Secret) (Secret, error) {
	if err := normalize(&sec); err != nil {
		return Secret{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	sec.CreatedAt, sec.UpdatedAt = now, now
	if old, ok := s.secrets[sec.Name]; ok {
		sec.CreatedAt = old.CreatedAt
	}
	if err := s.commitLocked(sec.Name, &sec); err != nil {
		return Secret{}, err
	}
	sec.Value = ""
	return sec, nil
}

// Renew replaces the value of a renewed secret (one with a token field),
// keeping the rest: its token endpoint answered a session with the next.
func (s *Store) Renew(name string, value Value) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sec, ok := s.secrets[name]
	if !ok || sec.TokenField == "" {
		return errdefs.NotFound("no renewed secret named %q", name)
	}
	sec.Value = value
	if err := normalize(&sec); err != nil {
		return err
	}
	if sec.Value == s.secrets[name].Value {
		return nil
	}
	sec.UpdatedAt = time.Now().UTC()
	return s.commitLocked(name, &sec)
}

// Remove deletes a secret.
func (s *Store) Remove(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.secrets[name]; !ok {
		return errdefs.NotFound("no secret named %q (secret ls lists them)", name)
	}
	return s.commitLocked(name, nil)
}

// commitLocked sets secret name to sec (removes it when nil) on disk, then
// in memory: a failed write changes nothing.
func (s *Store) commitLocked(name string, sec *Secret) error {
	next := make(map[string]Secret, len(s.secrets)+1)
	for k, v := range s.secrets {
		next[k] = v
	}
	if sec != nil {
		next[name] = *sec
	} else {
		delete(next, name)
	}
	if err := s.writeLocked(next); err != nil {
		return err
	}
	s.secrets = next
	return nil
}

// Get returns a secret with its value.
func (s *Store) Get(name string) (Secret, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sec, ok := s.secrets[name]
	return sec, ok
}

// List returns every secret without its value, sorted by name.
func (s *Store) List() []Secret {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Secret, 0, len(s.secrets))
	for _, sec := range s.secrets {
		sec.Value = ""
		out = append(out, sec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// jsonOffset is where a decoding error is, as far as it says.
func jsonOffset(err error) int64 {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return syn.Offset
	case errors.As(err, &typ):
		return typ.Offset
	}
	return 0
}

func (s *Store) writeLocked(all map[string]Secret) error {
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("secrets store: %w", err)
	}
	if err := os.Chmod(filepath.Dir(s.path), 0o700); err != nil {
		return fmt.Errorf("secrets store: %w", err)
	}
	f := file{Secrets: []fileSecret{}}
	for _, sec := range all {
		f.Secrets = append(f.Secrets, fileSecret{
			Name: sec.Name, Value: string(sec.Value), Hosts: sec.Hosts, Headers: sec.Headers, Preset: sec.Preset,
			TokenHosts: sec.TokenHosts, TokenField: sec.TokenField, CreatedAt: sec.CreatedAt, UpdatedAt: sec.UpdatedAt,
		})
	}
	sort.Slice(f.Secrets, func(i, j int) bool { return f.Secrets[i].Name < f.Secrets[j].Name })
	if err := atomicfile.WriteJSON(s.path, f, 0o600); err != nil {
		return fmt.Errorf("secrets store: %w", err)
	}
	return nil
}
