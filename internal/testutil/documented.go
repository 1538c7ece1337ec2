package testutil

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// Documented fails t unless each of msgs is matched whole by a message of
// the doc at path: a line "> TEXT", where … stands for any text. The tests
// that produce the messages users read (the strategy checks' reasons) call
// it, so a message changed or added without its words in the operator
// guide fails.
func Documented(t testing.TB, path string, msgs ...string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the doc the messages must be in: %v", err)
	}
	var patterns []*regexp.Regexp
	for _, line := range strings.Split(string(data), "\n") {
		text, ok := strings.CutPrefix(line, "> ")
		if !ok {
			continue
		}
		parts := strings.Split(text, "…")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		patterns = append(patterns, regexp.MustCompile("^"+strings.Join(parts, "(?s:.*)")+"$"))
	}
	for _, msg := range msgs {
		found := false
		for _, p := range patterns {
			found = found || p.MatchString(msg)
		}
		if !found {
			t.Errorf("%s does not document the message %q: add it as a line \"> TEXT\" (… for what varies)", path, msg)
		}
	}
}
