package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
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
// closes the session's stdin at r's end. A write that cannot have reached
// the daemon is tried again after a restart; one whose fate is unknown is
// not, so no input is ever doubled.
func forwardStdin(ctx context.Context, g *globals, id string, r io.Reader, stderr io.Writer) {
	buf := make([]byte, stdinChunk)
	var c *client
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	call := func(f func(*client) error) error {
		start := time.Now()
		for {
			if c == nil {
				var err error
				if c, err = g.connect(ctx); err != nil {
					if time.Since(start) > reconnectFor || ctx.Err() != nil {
						return err
					}
					time.Sleep(reconnectEvery)
					continue
				}
			}
			err := f(c)
			if err != nil && retryable(err) {
				c.Close()
				c = nil
			}
			return err
		}
	}
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			err := call(func(c *client) error {
				_, err := c.admin.WriteStdin(ctx, &adminv1.WriteStdinRequest{Id: id, Data: buf[:n]})
				return err
			})
			if err != nil {
				if !errors.Is(rpcstatus.FromStatus(err), errdefs.ErrFailedPrecondition) {
					fmt.Fprintln(stderr, "agentconnect: stdin:", message(err))
				}
				return
			}
		}
		if rerr != nil {
			call(func(c *client) error {
				_, err := c.admin.CloseStdin(ctx, &adminv1.CloseStdinRequest{Id: id})
				return err
			})
			return
		}
	}
}
