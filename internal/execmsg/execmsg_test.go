package execmsg

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type buffer struct{ strings.Builder }

func (b *buffer) Close() error { return nil }

func TestSendReceive(t *testing.T) {
	var b buffer
	want := Message{Argv: []string{"sh", "-c", "echo $A"}, Env: []string{"A=b=c", "PATH=/bin"}}
	if err := Send(&b, want); err != nil {
		t.Fatal(err)
	}
	got, err := Receive(strings.NewReader(b.String()))
	if err != nil || strings.Join(got.Argv, " ") != "sh -c echo $A" || strings.Join(got.Env, " ") != "A=b=c PATH=/bin" {
		t.Errorf("Receive = %+v, %v; want %+v", got, err, want)
	}
}

func TestReceiveRefuses(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{
		{"", ErrNone.Error()},
		{"{", "the command's message"},
		{`{"argv":[],"env":["A=1"]}`, "names no command"},
		{strings.Repeat(" ", maxSize+1), "is over"},
	} {
		_, err := Receive(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Receive(%.20q) = %v, want an error saying %q", c.in, err, c.want)
		}
	}
	if _, err := Receive(strings.NewReader("")); !errors.Is(err, ErrNone) {
		t.Errorf("Receive of nothing = %v, want ErrNone", err)
	}
}

// TestLookPathUsesTheMessagesPath: the command is found on the runtime's
// PATH, not the launcher's, which stays as it was; a file that is not
// executable is skipped, and a match through "." in PATH refused, as
// exec.LookPath does.
func TestLookPathUsesTheMessagesPath(t *testing.T) {
	ownPath := os.Getenv("PATH")
	t.Cleanup(func() {
		if got := os.Getenv("PATH"); got != ownPath {
			t.Errorf("LookPath changed this process's PATH to %q", got)
		}
	})
	dir := t.TempDir()
	noexec := filepath.Join(dir, "a")
	os.MkdirAll(noexec, 0o755)
	os.WriteFile(filepath.Join(noexec, "tool"), []byte("#!/bin/sh\n"), 0o644)
	bin := filepath.Join(dir, "b")
	os.MkdirAll(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "tool"), []byte("#!/bin/sh\n"), 0o755)
	got, err := LookPath("tool", []string{"HOME=/x", "PATH=" + noexec + ":" + bin})
	if err != nil || got != filepath.Join(bin, "tool") {
		t.Errorf("lookPath = %q, %v; want %s", got, err, filepath.Join(bin, "tool"))
	}
	if _, err := LookPath("tool", []string{"PATH=" + noexec}); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("lookPath with only a non-executable tool = %v, want ErrNotFound", err)
	}
	if got, err := LookPath(filepath.Join(bin, "tool"), nil); err != nil || got != filepath.Join(bin, "tool") {
		t.Errorf("lookPath of a path = %q, %v; want it as given", got, err)
	}
	t.Chdir(bin)
	if _, err := LookPath("tool", []string{"PATH=."}); !errors.Is(err, exec.ErrDot) {
		t.Errorf("lookPath through . in PATH = %v, want exec.ErrDot", err)
	}
}

// TestExecCodes: what a shell answers for a command that is missing (127)
// or cannot run (126).
func TestExecCodes(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "plain"), []byte("data"), 0o644)
	for _, c := range []struct {
		argv0 string
		code  int
	}{{"no-such-command-here", 127}, {filepath.Join(dir, "missing"), 127}, {filepath.Join(dir, "plain"), 126}} {
		code, err := Exec(Message{Argv: []string{c.argv0}, Env: []string{"PATH=" + dir}})
		if code != c.code || err == nil {
			t.Errorf("Exec(%s) = %d, %v; want %d and the error", c.argv0, code, err, c.code)
		}
	}
}
