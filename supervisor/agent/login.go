package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
)

// maxLoginTemplate bounds a login's credentials file.
const maxLoginTemplate = 64 << 10

// loginMarker is a token's place in a login template: {{SECRET}}.
var loginMarker = lazyRegexp(`\{\{([A-Za-z0-9][A-Za-z0-9._-]{0,62})\}\}`)

// LoginSecrets are the names of the secrets a login's template holds, in
// the order they first appear.
func (l *Login) LoginSecrets() []string {
	if l == nil {
		return nil
	}
	var names []string
	for _, m := range loginMarker().FindAllStringSubmatch(l.Template, -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

// Render is the credentials file with each secret's marker replaced by
// what value(name) gives for it.
func (l *Login) Render(value func(name string) string) string {
	return loginMarker().ReplaceAllStringFunc(l.Template, func(m string) string {
		return value(m[2 : len(m)-2])
	})
}

func validateLogin(l *Login) error {
	if l == nil {
		return nil
	}
	if !ValidName(l.Runtime) {
		return fmt.Errorf("runtime %q is not a name", l.Runtime)
	}
	clean := filepath.Clean(l.File)
	if l.File == "" || filepath.IsAbs(l.File) || clean != l.File || clean == "." || strings.HasPrefix(clean, "../") || clean == ".." {
		return fmt.Errorf("file %q: want a clean path inside the agent's home, like .claude/.credentials.json", l.File)
	}
	if len(l.Template) > maxLoginTemplate || strings.ContainsRune(l.Template, 0) {
		return fmt.Errorf("the credentials file is over %d bytes or holds a NUL byte", maxLoginTemplate)
	}
	if len(l.LoginSecrets()) == 0 {
		return errors.New("the credentials file holds no {{SECRET}} for a token: run agent login again")
	}
	return nil
}
