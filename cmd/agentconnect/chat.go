package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/chat"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// exitInterrupted is chat's exit code when the person cancelled the turn
// or left with Ctrl-C, as a shell has it for SIGINT.
const exitInterrupted = 130

type chatFlags struct {
	yes, deny, json, keep bool
	session, auth, mode   string
	standalone            standaloneFlags
}

func newChatCommand(g *globals) *cobra.Command {
	var f chatFlags
	cmd := &cobra.Command{
		Use:   "chat AGENT [PROMPT]",
		Short: "Talk to an agent: a terminal ACP client through the daemon",
		Long: `Start a session of AGENT and talk to its runtime over ACP (the Agent Client
Protocol): initialize, session/new in the agent's workspace, then a turn for
each prompt. With PROMPT it runs that one turn; otherwise each line of stdin is
a prompt (an empty line is skipped; the end of stdin ends the chat).

What the runtime does is shown as it streams: its messages, its thinking, its
plan, and each tool call with its status. A permission request is asked on the
terminal (answer with its number; answers are read from stdin), or answered by
--yes (allow once) or --deny (refuse). Ctrl-C during a turn cancels it
(session/cancel); Ctrl-C again, or between turns, leaves.

The session is stopped and removed when the chat ends, unless --keep. A chat
that is cut off (the terminal closed, the process killed) leaves its session
running: --session ID attaches to its conversation again, shows a turn in
progress to its end, and goes on with new prompts. The daemon may restart
during a turn: the chat carries on where it was.

With --standalone no daemon is needed: the chat runs its own srt sandbox
(a private daemon home, removed at the end) for the runtime given by --runtime,
in the current directory or --workspace.

Exit codes: 0 when the last turn ended, 130 when it was cancelled or the chat
interrupted, 1 when something failed.`,
		Args: cobra.RangeArgs(0, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.yes && f.deny {
				return errors.New("--yes and --deny are each other's opposite: give one")
			}
			if f.standalone.on {
				return runStandaloneChat(cmd, g, f, args)
			}
			for _, name := range []string{"runtime", "workspace", "allow-domain", "env"} {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s describes a standalone chat's agent: give --standalone too, or set it on the daemon's agent (agent edit)", name)
				}
			}
			agentName, prompt := "", ""
			switch {
			case f.session == "" && len(args) == 0:
				return errors.New("give the AGENT to chat with (or --session ID to attach to a running session)")
			case f.session != "" && len(args) == 1:
				// With --session an only argument is the prompt, unless it
				// names the session's agent.
				prompt = args[0]
			case len(args) >= 1:
				agentName = args[0]
				if len(args) == 2 {
					prompt = args[1]
				}
			}
			return chatThroughDaemon(cmd, g, f, agentName, prompt)
		},
	}
	cmd.Flags().BoolVarP(&f.yes, "yes", "y", false, "allow every permission request once, without asking")
	cmd.Flags().BoolVar(&f.deny, "deny", false, "refuse every permission request, without asking")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the conversation as JSON lines (daemon_session, session, prompt, update, question, permission, note, turn_end)")
	cmd.Flags().BoolVar(&f.keep, "keep", false, "keep the session running when the chat ends (attach again with --session)")
	cmd.Flags().StringVar(&f.session, "session", "", "attach to the conversation of a running session `ID` instead of starting one")
	cmd.Flags().StringVar(&f.auth, "auth", "", "the ACP authentication `METHOD` before session/new (default: the known runtime's, e.g. openai-api-key for codex)")
	cmd.Flags().StringVar(&f.mode, "mode", "", "switch the new ACP session to `MODE` first (session/set_mode; codex: read-only, auto, full-access)")
	addStandaloneFlags(cmd, &f.standalone)
	return cmd
}

// chatThroughDaemon chats with a new session of agentName, or with the
// running session --session names.
func chatThroughDaemon(cmd *cobra.Command, g *globals, f chatFlags, agentName, prompt string) error {
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	if f.session != "" && f.mode != "" {
		return errors.New("--mode switches a new conversation; the session's is set already")
	}
	c, err := g.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var s *adminv1.Session
	started := false
	if f.session != "" {
		s, err = c.admin.GetSession(ctx, &adminv1.GetSessionRequest{Id: f.session})
		if err == nil && s.State != "running" {
			err = fmt.Errorf("session %s is %s: chat attaches to running sessions only (start a new one with agentconnect chat %s)", s.Id, s.State, s.Agent)
		}
		if err == nil && agentName != "" && agentName != s.Agent {
			err = fmt.Errorf("session %s is of agent %s, not %s", s.Id, s.Agent, agentName)
		}
	} else {
		s, err = c.admin.StartSession(ctx, &adminv1.StartSessionRequest{Agent: agentName})
		started = err == nil
	}
	if err != nil {
		return err
	}
	if f.auth == "" {
		if a, err := c.admin.GetAgent(ctx, &adminv1.GetAgentRequest{Name: s.Agent}); err == nil {
			f.auth = runtimes.Known[a.Runtime].Auth
		}
	}
	c.Close() // the conversation makes connections of its own, across restarts
	id := s.Id
	if started && !f.keep {
		defer removeSession(g, id)
	}
	if s.State != "running" {
		end, err := waitSession(ctx, g, id)
		if err != nil {
			return err
		}
		return fmt.Errorf("session %s did not start: %s", id, end.Reason)
	}
	if f.json {
		b, _ := json.Marshal(map[string]any{"type": "daemon_session", "id": id, "agent": s.Agent, "strategy": s.Strategy, "nativeSandbox": s.NativeSandbox})
		fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
	} else {
		fmt.Fprintf(cmd.ErrOrStderr(), "[session %s of agent %s (%s); ", id, s.Agent, s.Strategy)
		if started && !f.keep {
			fmt.Fprintln(cmd.ErrOrStderr(), "it ends with the chat]")
		} else {
			fmt.Fprintf(cmd.ErrOrStderr(), "attach again with: agentconnect chat --session %s]\n", id)
		}
	}
	return converse(ctx, cmd, g, f, s, prompt, !started)
}

// converse runs the conversation over the session's stdin and output log.
func converse(ctx context.Context, cmd *cobra.Command, g *globals, f chatFlags, s *adminv1.Session, prompt string, resume bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := chat.Options{
		ToRuntime: &stdinWriter{ctx: ctx, g: g, id: s.Id, record: true},
		Out:       cmd.OutOrStdout(), JSON: f.json, Input: cmd.InOrStdin(), Prompt: prompt,
		Cwd: s.Workspace, Auth: f.auth, Mode: f.mode,
	}
	switch {
	case f.yes:
		opts.Permit = chat.Yes
	case f.deny:
		opts.Permit = chat.Deny
	}
	var from uint64
	if resume {
		st, end, err := readConversation(ctx, g, s.Id)
		if err != nil {
			return err
		}
		opts.Resume, from = &st, end
	}
	stderr := &tail{max: 8 << 10}
	pr, pw := io.Pipe()
	followed := make(chan error, 1)
	go func() {
		fl := &follower{g: g, id: s.Id, offset: from, follow: true, stdout: pw, stderr: stderr}
		err := fl.run(ctx)
		pw.CloseWithError(io.EOF)
		followed <- err
	}()
	opts.FromRuntime = pr
	if opts.Resume != nil && opts.Resume.InFlight != nil {
		opts.FromRuntime, opts.Finished = chat.WatchAnswer(pr, opts.Resume.InFlight)
	}
	interrupts := make(chan struct{}, 1)
	opts.Interrupt = interrupts
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	go func() {
		for sig := range signals {
			if sig != syscall.SIGINT {
				cancel() // SIGTERM, SIGHUP: leave now
				return
			}
			select {
			case interrupts <- struct{}{}:
			default:
			}
		}
	}()
	res, err := chat.Run(ctx, opts)
	if err != nil {
		if errors.Is(err, chat.ErrInterrupted) || ctx.Err() != nil {
			return &exitError{code: exitInterrupted}
		}
		select {
		case ferr := <-followed:
			if ferr != nil {
				err = fmt.Errorf("%w (the session's output: %v)", err, ferr)
			}
		default:
		}
		if t := strings.TrimSpace(stderr.String()); t != "" {
			err = fmt.Errorf("%w\nthe runtime's last stderr:\n%s", err, t)
		}
		return err
	}
	if res.StopReason == "cancelled" {
		return &exitError{code: exitInterrupted}
	}
	return nil
}

// readConversation reads the session's log to its current end, both
// directions, and returns the conversation's state and that end.
func readConversation(ctx context.Context, g *globals, id string) (chat.State, uint64, error) {
	c, err := g.connect(ctx)
	if err != nil {
		return chat.State{}, 0, err
	}
	defer c.Close()
	stream, err := c.admin.Attach(ctx, &adminv1.AttachRequest{Id: id, Stdin: true})
	if err != nil {
		return chat.State{}, 0, err
	}
	var recs []chat.Record
	var end uint64
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return chat.State{}, 0, err
		}
		end = chunk.NextOffset
		if chunk.Stream != adminv1.Stream_STDERR {
			recs = append(recs, chat.Record{FromRuntime: chunk.Stream == adminv1.Stream_STDOUT, Data: chunk.Data})
		}
	}
	st := chat.Scan(recs)
	if st.SessionID == "" {
		return chat.State{}, 0, fmt.Errorf("session %s has no ACP conversation in its log to attach to (was it started by chat?)", id)
	}
	return st, end, nil
}

// removeSession stops and removes a session chat started.
func removeSession(g *globals, id string) {
	ctx := context.Background()
	c, err := g.connect(ctx)
	if err != nil {
		return
	}
	defer c.Close()
	c.admin.StopSession(ctx, &adminv1.StopSessionRequest{Id: id})
	c.admin.RemoveSession(ctx, &adminv1.RemoveSessionRequest{Id: id})
}

// tail keeps the last max bytes written to it: the runtime's stderr, shown
// when the chat fails.
type tail struct {
	max int
	mu  sync.Mutex
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
