// Package helper is the daemon's one-shot calls of a strategy's binaries,
// for the work that needs a strategy's code, which the daemon does not link:
// agentconnect-shim-vm's `probe` (can microsandbox run here?) and
// agentconnect-vmimage's `image` (prepare a microsandbox guest image). The request is JSON on the helper's stdin, the answer JSON on its
// stdout; what it says on stderr goes to the daemon's log.
package helper

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"

	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/fileid"
)

// ProbeRequest asks whether microsandbox sessions can run here.
type ProbeRequest struct {
	VM       config.VM `json:"vm"`
	ImageDir string    `json:"imageDir"` // the default image's directory
}

// ProbeResponse is "" when they can, else the reason with the fix.
type ProbeResponse struct {
	Reason string `json:"reason"`
}

// ImageRequest asks for a guest image: the default one (Ref ""), or Ref
// pulled or read and turned into a root filesystem, cached in ImagesDir.
type ImageRequest struct {
	ImageDir  string `json:"imageDir"`
	ImagesDir string `json:"imagesDir"`
	Ref       string `json:"ref"`
}

// ImageResponse is the image's files and content digest, or Error.
type ImageResponse struct {
	Kernel string `json:"kernel"`
	Initrd string `json:"initrd"`
	Rootfs string `json:"rootfs"`
	Digest string `json:"digest"`
	// Runtimes are the known runtimes the image holds, "package@version"
	// by name: the daemon mounts no runtime tree the image has.
	Runtimes map[string]string `json:"runtimes,omitempty"`
	Error    string            `json:"error,omitempty"`
	// Inputs are the files the answer was read from, as they were while
	// the helper read them: the same request has the same answer while
	// each of them is still that version (fileid.Unchanged). Empty: it may
	// not (a registry's tag can move), so the daemon asks each time.
	Inputs []fileid.ID `json:"inputs,omitempty"`
}

// maxAnswer bounds what a helper's answer may be.
const maxAnswer = 1 << 20

// Call runs `shim command` with req on its stdin and decodes its answer
// into resp; each line it writes on stderr is passed to logf. ctx bounds it.
func Call(ctx context.Context, shim, command string, req, resp any, logf func(string, ...any)) error {
	in, err := json.Marshal(req)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, shim, command)
	cmd.Stdin = bytes.NewReader(in)
	var out bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: maxAnswer}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s %s: %w", shim, command, err)
	}
	var said []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if len(said) < 20 {
			said = append(said, line)
		}
		logf("%s %s: %s", shim, command, line)
	}
	io.Copy(io.Discard, stderr)
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s did not answer in time: %w", shim, command, ctx.Err())
		}
		return fmt.Errorf("%s %s: %w: %s", shim, command, err, strings.Join(said, "; "))
	}
	if err := json.Unmarshal(out.Bytes(), resp); err != nil {
		return fmt.Errorf("%s %s answered %q: %w", shim, command, out.Bytes(), err)
	}
	return nil
}

// Serve is the helper's side of Call: it decodes the request from stdin,
// runs do, and encodes its answer on stdout.
func Serve[Req, Resp any](stdin io.Reader, stdout io.Writer, do func(Req) Resp) error {
	var req Req
	if err := json.NewDecoder(io.LimitReader(stdin, maxAnswer)).Decode(&req); err != nil {
		return fmt.Errorf("read the request: %w", err)
	}
	return json.NewEncoder(stdout).Encode(do(req))
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if len(p) > l.n {
		return 0, errors.New("the answer is too long")
	}
	l.n -= len(p)
	return l.w.Write(p)
}
