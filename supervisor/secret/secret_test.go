package secret

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

const realValue = "sk-test-0123456789abcdef"

func TestValuePrintsRedacted(t *testing.T) {
	sec := Secret{Name: "k", Value: realValue}
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		if out := fmt.Sprintf(f, sec); strings.Contains(out, realValue) {
			t.Errorf("fmt %s of a Secret shows the value: %s", f, out)
		}
	}
	if err := fmt.Errorf("set %v", sec.Value); strings.Contains(err.Error(), realValue) {
		t.Errorf("an error with the value shows it: %v", err)
	}
}

func TestSetGetListRemove(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets", "secrets.json")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Set(Secret{Name: "claude", Value: realValue, Preset: "anthropic", Hosts: []string{"API.example.com:8443", "api.anthropic.com"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Value != "" {
		t.Error("Set returned the value")
	}
	if want := []string{"api.anthropic.com", "api.example.com:8443"}; !reflect.DeepEqual(got.Hosts, want) {
		t.Errorf("hosts %v, want %v (preset's and the given, lower case, once each)", got.Hosts, want)
	}
	if want := []string{"authorization", "x-api-key"}; !reflect.DeepEqual(got.Headers, want) {
		t.Errorf("headers %v, want %v", got.Headers, want)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v; want %04o", p, err, fi.Mode().Perm(), want)
		}
	}
	// A second store reads what the first wrote.
	s2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if sec, ok := s2.Get("claude"); !ok || sec.Value != realValue {
		t.Errorf("reopened: %v %v", sec, ok)
	}
	if l := s2.List(); len(l) != 1 || l[0].Value != "" || l[0].Name != "claude" {
		t.Errorf("List = %+v, want claude without its value", l)
	}
	if err := s2.Remove("claude"); err != nil {
		t.Fatal(err)
	}
	if err := s2.Remove("claude"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove twice: %v", err)
	}
	if s3, _ := Open(path); len(s3.List()) != 0 {
		t.Errorf("after Remove the file still holds %v", s3.List())
	}
}

// TestBadInputChangesNothing: every refusal is clear, names no value and
// leaves the file as it was.
func TestBadInputChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.json")
	s, _ := Open(path)
	if _, err := s.Set(Secret{Name: "ok", Value: realValue, Hosts: []string{"example.com"}}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	for name, sec := range map[string]Secret{
		"bad name":                 {Name: "-x", Value: realValue, Hosts: []string{"example.com"}},
		"empty value":              {Name: "ok", Hosts: []string{"example.com"}},
		"newline":                  {Name: "ok", Value: realValue + "\nX-Evil: 1", Hosts: []string{"example.com"}},
		"no host":                  {Name: "ok", Value: realValue},
		"bad host":                 {Name: "ok", Value: realValue, Hosts: []string{"exa mple.com"}},
		"bad port":                 {Name: "ok", Value: realValue, Hosts: []string{"example.com:99999"}},
		"bad header":               {Name: "ok", Value: realValue, Hosts: []string{"example.com"}, Headers: []string{"x api key"}},
		"no preset":                {Name: "ok", Value: realValue, Preset: "nope"},
		"value too big":            {Name: "ok", Value: Value(strings.Repeat("a", MaxValue+1)), Hosts: []string{"example.com"}},
		"token field without host": {Name: "ok", Value: realValue, Hosts: []string{"example.com"}, TokenField: "access_token"},
		"token host without field": {Name: "ok", Value: realValue, TokenHosts: []string{"example.com"}},
		"no such token field":      {Name: "ok", Value: realValue, TokenHosts: []string{"example.com"}, TokenField: "password"},
	} {
		_, err := s.Set(sec)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
			continue
		}
		if strings.Contains(err.Error(), realValue) {
			t.Errorf("%s: the error shows the value: %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a refused Set changed the file")
	}
	if sec, _ := s.Get("ok"); sec.Value != realValue {
		t.Error("a refused Set changed the secret")
	}
}

func TestOpenRefusesAReadableOrBadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets.json")
	os.WriteFile(path, []byte(`{"secrets":[{"name":"a","value":"`+realValue+`"}]}`), 0o644)
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a 0644 store: %v, want a refusal saying chmod 600", err)
	}
	os.Chmod(path, 0o600)
	if s, err := Open(path); err != nil || len(s.List()) != 1 {
		t.Errorf("the same store at 0600: %v", err)
	}
	os.WriteFile(path, []byte(`{"secrets":[{"name":"a","value":"`+realValue+`"x}]}`), 0o600)
	_, err := Open(path)
	if err == nil || strings.Contains(err.Error(), realValue) || strings.Contains(err.Error(), "'x'") {
		t.Errorf("a store that is not JSON: %v, want an error quoting nothing of it", err)
	}
	t.Log(err)
}

func TestPlaceholders(t *testing.T) {
	a, b := NewPlaceholder(), NewPlaceholder()
	if a == b || !strings.HasPrefix(a, "agentconnect-placeholder-") || len(a) != len("agentconnect-placeholder-")+32 {
		t.Errorf("placeholders %q, %q: want unique, prefixed, 32 hex", a, b)
	}
}

// TestRenew: a renewed secret takes its next value and keeps the rest, on
// disk too; a secret that is not renewed, or gone, is not.
func TestRenew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.json")
	s, _ := Open(path)
	if _, err := s.Set(Secret{Name: "refresh", Value: realValue, TokenHosts: []string{"auth.example.com"}, TokenField: "refresh_token"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(Secret{Name: "plain", Value: realValue, Hosts: []string{"example.com"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew("refresh", "next-value"); err != nil {
		t.Fatal(err)
	}
	s2, _ := Open(path)
	if sec, _ := s2.Get("refresh"); sec.Value != "next-value" || sec.TokenField != "refresh_token" || !reflect.DeepEqual(sec.TokenHosts, []string{"auth.example.com"}) {
		t.Errorf("renewed: %+v", sec)
	}
	for _, name := range []string{"plain", "gone"} {
		if err := s.Renew(name, "x"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Renew(%s): %v, want NotFound", name, err)
		}
	}
	if err := s.Renew("refresh", "a\nb"); err == nil {
		t.Error("a value with a newline was taken")
	}
}
