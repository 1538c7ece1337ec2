// Package execmsg is what a launcher that was started early (the shim's
// init, srt's sandbox-exec) is told to exec once the session binds it: the
// command and its whole environment, as one JSON message ended by closing
// the pipe. Starting the launcher first and telling it what to run later is
// what lets a boundary be built before the session that uses it exists
// (a warm boundary), with one code path for warm and cold starts.
package execmsg

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// maxSize bounds a message: an environment with secrets' values is at most
// a few hundred KiB (the kernel's own limit on argv+env is far below).
const maxSize = 8 << 20

// Message is what to exec.
type Message struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
}

// Send writes m to w and closes it: the launcher execs once it reads EOF.
func Send(w io.WriteCloser, m Message) error {
	data, err := json.Marshal(m)
	if err == nil {
		_, err = w.Write(data)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// ErrNone is Receive's error when the writer closed without a message: the
// shim went away, or gave up on the launcher.
var ErrNone = errors.New("no command came")

// Receive reads one message from r, to EOF.
func Receive(r io.Reader) (Message, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxSize+1))
	if err != nil {
		return Message{}, err
	}
	if len(data) == 0 {
		return Message{}, ErrNone
	}
	if len(data) > maxSize {
		return Message{}, fmt.Errorf("the command's message is over %d bytes", maxSize)
	}
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return Message{}, fmt.Errorf("the command's message: %w", err)
	}
	if len(m.Argv) == 0 {
		return Message{}, errors.New("the command's message names no command")
	}
	return m, nil
}

// Exec replaces the process with m's command, found on m.Env's PATH by
// LookPath. It returns only on failure, with the exit code a shell gives:
// 127 not found, 126 found but cannot run.
func Exec(m Message) (code int, err error) {
	path, err := LookPath(m.Argv[0], m.Env)
	if err == nil {
		err = syscall.Exec(path, m.Argv, m.Env)
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, syscall.ENOENT) {
		return 127, err
	}
	return 126, err
}

// LookPath is exec.LookPath with the PATH of env (the runtime's, which it
// is about to exec with, not this process's), as the runtime's own shell
// would search it: the first executable file wins, and a match through "."
// or an empty entry in PATH is refused (exec.ErrDot).
func LookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return exec.LookPath(file)
	}
	var path string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v // the last, as os/exec counts a duplicate
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		candidate := filepath.Join(dir, file)
		if !strings.Contains(candidate, "/") {
			candidate = "./" + candidate
		}
		if _, err := exec.LookPath(candidate); err != nil {
			continue
		}
		if !filepath.IsAbs(candidate) {
			return candidate, &exec.Error{Name: file, Err: exec.ErrDot}
		}
		return candidate, nil
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}
