package vmtransport

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// FuzzPreface: a line is read as a preface or refused with ErrBadPreface;
// one that is read writes back as the same line (the host writes what the
// guest reads), and nothing past the newline is taken.
func FuzzPreface(f *testing.F) {
	for _, s := range []string{"ttrpc\n", "stdin p1\n", "stdout runtime\npayload", "stderr a.b-c_d\n", "ttrpc x\n",
		"stdin\n", "stdin -x\n", "stdout " + strings.Repeat("a", 64) + "\n", "exec p1\n", "stdin p1", "\n", "stdin p1 p2\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		line, err := readLine(r, MaxPrefaceLen)
		if err != nil {
			if !errors.Is(err, ErrBadPreface) {
				t.Fatalf("readLine: %v, want ErrBadPreface", err)
			}
			return
		}
		if taken := len(data) - r.Len(); taken != len(line)+1 {
			t.Fatalf("read %d bytes for a line of %d", taken, len(line))
		}
		kind, id, err := parsePreface(line)
		if err != nil {
			if !errors.Is(err, ErrBadPreface) {
				t.Fatalf("parsePreface(%q): %v, want ErrBadPreface", line, err)
			}
			return
		}
		back, err := prefaceLine(kind, id)
		if err != nil || back != line+"\n" {
			t.Fatalf("preface %q read as %q %q, written back as %q (%v)", line, kind, id, back, err)
		}
	})
}
