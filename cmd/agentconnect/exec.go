package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/rpcstatus"
)

// Exit codes of exec, as docker run has them.
const (
	exitAgentconnect = 125 // agentconnect itself failed, or the boundary did
)

// stdinChunk is how much of stdin one WriteStdin carries.
const stdinChunk = 64 << 10

func newExecCommand(g *globals) *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:   "exec AGENT [-- CMD [ARG...]]",
		Short: "Run a session of an agent with this terminal's stdio; exit with its exit code",
		Long: `Start a session of AGENT (running CMD instead of the agent's runtime when given
after --), pass stdin, stdout and stderr through, and exit as the session did:

  the runtime's own exit code
  128+N   when it was killed by signal N
  125     when agentconnect failed, or the boundary could not be set up
  126     when the command cannot run
  127     when the command is not found

SIGINT, SIGTERM and SIGHUP are passed on to the runtime. The session is removed
when it ends, unless --keep.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			positional, command := splitDash(cmd, args)
			if len(positional) != 1 {
				return &exitError{code: exitAgentconnect, err: errors.New("give one AGENT (and the command after --)")}
			}
			code, err := execSession(cmd.Context(), g, positional[0], command, keep, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return &exitError{code: exitAgentconnect, err: err}
			}
			if code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the session after it ends")
	return cmd
}

func execSession(ctx context.Context, g *globals, agentName string, command []string, keep bool, stdout, stderr io.Writer) (int, error) {
	c, err := g.connect(ctx)
	if err != nil {
		return 0, err
	}
	s, err := c.admin.StartSession(ctx, &adminv1.StartSessionRequest{Agent: agentName, Command: command})
	c.Close()
	if err != nil {
		return 0, err
	}
	id := s.Id
	if !keep {
		defer func() {
			if c, err := g.connect(context.Background()); err == nil {
				c.admin.RemoveSession(context.Background(), &adminv1.RemoveSessionRequest{Id: id})
				c.Close()
			}
		}()
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	go func() {
		for sig := range signals {
			if c, err := g.connect(ctx); err == nil {
				c.admin.KillSession(ctx, &adminv1.KillSessionRequest{Id: id, Signal: uint32(sig.(syscall.Signal))})
				c.Close()
			}
		}
	}()
	if s.State == "running" {
		go forwardStdin(ctx, g, id, os.Stdin, stderr)
	}
	f := &follower{g: g, id: id, follow: true, stdout: stdout, stderr: stderr}
	if err := f.run(ctx); err != nil {
		return 0, err
	}
	end, err := waitSession(ctx, g, id)
	if err != nil {
		return 0, err
	}
	switch {
	case end.State == "lost":
		return 0, fmt.Errorf("session %s was lost: %s", id, end.Reason)
	case end.ExitCode < 0:
		return 0, fmt.Errorf("session %s did not start: %s", id, end.Reason)
	case end.ExitCode == 126 || end.ExitCode == 127:
		if end.Reason != "" {
			fmt.Fprintln(stderr, "agentconnect:", end.Reason)
		}
	}
	return int(end.ExitCode), nil
}

// waitSession waits for a session to end, across daemon restarts.
func waitSession(ctx context.Context, g *globals, id string) (*adminv1.Session, error) {
	start := time.Now()
	for {
		c, err := g.connect(ctx)
		if err == nil {
			s, werr := c.admin.WaitSession(ctx, &adminv1.WaitSessionRequest{Id: id})
			c.Close()
			if werr == nil {
				return s, nil
			}
			err = werr
		}
		if !retryable(err) || time.Since(start) > reconnectFor {
			return nil, err
		}
		select {
		case <-time.After(reconnectEvery):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// forwardStdin sends r to the session's stdin in acknowledged pieces, and
// closes the session's stdin at r's end.
func forwardStdin(ctx context.Context, g *globals, id string, r io.Reader, stderr io.Writer) {
	w := &stdinWriter{ctx: ctx, g: g, id: id}
	defer w.close()
	buf := make([]byte, stdinChunk)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				if !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
					fmt.Fprintln(stderr, "agentconnect: stdin:", message(err))
				}
				return
			}
		}
		if rerr != nil {
			w.call(func(c *client) error {
				_, err := c.admin.CloseStdin(ctx, &adminv1.CloseStdinRequest{Id: id})
				return err
			})
			return
		}
	}
}

// stdinWriter writes to a session's stdin through the daemon, in pieces the
// API takes, each acknowledged. A write that cannot have reached the daemon
// is tried again after a restart; one whose fate is unknown is not, so no
// input is ever doubled. With record, the session's log keeps what was
// written (chat's side of the conversation).
type stdinWriter struct {
	ctx    context.Context
	g      *globals
	id     string
	record bool

	mu sync.Mutex // one Write at a time: a message is not interleaved
	c  *client
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	written := 0
	for len(p) > 0 {
		n := min(len(p), stdinChunk)
		err := w.call(func(c *client) error {
			_, err := c.admin.WriteStdin(w.ctx, &adminv1.WriteStdinRequest{Id: w.id, Data: p[:n], Record: w.record})
			return err
		})
		if err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// call runs f on a connection, connecting again (for reconnectFor) when the
// daemon cannot be reached: a connection that ended before the call (a
// restart in between) is replaced, since nothing sent on it can arrive.
func (w *stdinWriter) call(f func(*client) error) error {
	start := time.Now()
	if w.c != nil && w.c.gone.Load() {
		w.close()
	}
	for w.c == nil {
		c, err := w.g.connect(w.ctx)
		if err == nil {
			w.c = c
			break
		}
		if time.Since(start) > reconnectFor || w.ctx.Err() != nil {
			return err
		}
		time.Sleep(reconnectEvery)
	}
	err := f(w.c)
	if err != nil && retryable(err) {
		w.c.Close()
		w.c = nil
	}
	return err
}

func (w *stdinWriter) close() {
	if w.c != nil {
		w.c.Close()
		w.c = nil
	}
}
