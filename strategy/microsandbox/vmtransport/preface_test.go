package vmtransport

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestPrefaceRoundTrip(t *testing.T) {
	tests := []struct{ kind, id, line string }{
		{KindTTRPC, "", "ttrpc\n"},
		{KindStdin, "p1", "stdin p1\n"},
		{KindStdout, "agent.main-2", "stdout agent.main-2\n"},
		{KindStderr, strings.Repeat("x", 63), "stderr " + strings.Repeat("x", 63) + "\n"},
	}
	for _, tt := range tests {
		a, b := net.Pipe()
		go func() {
			if err := WritePreface(a, tt.kind, tt.id); err != nil {
				t.Errorf("WritePreface(%q, %q) = %v", tt.kind, tt.id, err)
			}
			io.WriteString(a, "payload")
			a.Close()
		}()
		kind, id, err := ReadPreface(b)
		if err != nil || kind != tt.kind || id != tt.id {
			t.Errorf("ReadPreface after %q = %q, %q, %v; want %q, %q, nil", tt.line, kind, id, err, tt.kind, tt.id)
		}
		rest, _ := io.ReadAll(b)
		if string(rest) != "payload" {
			t.Errorf("after the preface %q the payload = %q, want %q", tt.line, rest, "payload")
		}
		b.Close()
	}
}

func TestWritePrefaceRefuses(t *testing.T) {
	tests := []struct{ kind, id string }{
		{KindTTRPC, "x"},
		{KindStdout, ""},
		{KindStdin, "a b"},
		{KindStderr, "a\nstdout b"},
		{KindStdout, "-leading-dash"},
		{KindStdout, strings.Repeat("x", 64)},
		{"tty", "x"},
		{"", ""},
	}
	for _, tt := range tests {
		if err := WritePreface(io.Discard, tt.kind, tt.id); err == nil {
			t.Errorf("WritePreface(%q, %q) = nil, want an error", tt.kind, tt.id)
		}
	}
}

func TestReadPrefaceMalformed(t *testing.T) {
	tests := []struct{ name, input string }{
		{"empty line", "\n"},
		{"unknown kind", "tty 1\n"},
		{"ttrpc with an id", "ttrpc x\n"},
		{"stdio without an id", "stdout\n"},
		{"two spaces", "stdout  x\n"},
		{"three fields", "stdout x y\n"},
		{"bad id", "stdin ../x\n"},
		{"id too long", "stdin " + strings.Repeat("x", 64) + "\n"},
		{"carriage return", "ttrpc\r\n"},
		{"cut short", "stdout x"},
		{"no newline within the bound", strings.Repeat("a", MaxPrefaceLen+10)},
	}
	for _, tt := range tests {
		a, b := net.Pipe()
		go func() {
			io.WriteString(a, tt.input)
			a.Close()
		}()
		kind, id, err := ReadPreface(b)
		if !errors.Is(err, ErrBadPreface) {
			t.Errorf("%s: ReadPreface(%q) = %q, %q, %v; want ErrBadPreface", tt.name, tt.input, kind, id, err)
		}
		b.Close()
	}
}

func TestReadPrefaceTimesOut(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go io.WriteString(a, "stdo") // and then nothing
	start := time.Now()
	_, _, err := readPreface(b, 50*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("readPreface from a silent peer = %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("readPreface took %v, want about 50ms", d)
	}
}

func TestCheckID(t *testing.T) {
	for _, id := range []string{"a", "A9", "agent_1.main-x", strings.Repeat("z", 63)} {
		if err := CheckID(id); err != nil {
			t.Errorf("CheckID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "_a", "a/b", "a b", "é", strings.Repeat("z", 64), "a\x00"} {
		if err := CheckID(id); err == nil {
			t.Errorf("CheckID(%q) = nil, want an error", id)
		}
	}
}
