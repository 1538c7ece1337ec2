package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

func newSessionCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Start, follow, stop, resume and remove sessions",
		Long: `A session is one agent's conversation and the boundary around it; it outlives
one run of the runtime. States: running, exited (with exitCode), lost (with
reason: its shim died). Session ids may be shortened to a unique prefix.`,
	}
	cmd.AddCommand(newSessionStartCommand(g), newSessionResumeCommand(g), newSessionListCommand(g),
		newSessionShowCommand(g), newSessionAttachCommand(g), newSessionLogsCommand(g),
		newSessionStopCommand(g), newSessionKillCommand(g), newSessionWaitCommand(g), newSessionRemoveCommand(g),
		newSessionForwardCommand(g), newSessionForwardsCommand(g), newSessionUnforwardCommand(g))
	return cmd
}

func newSessionStartCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "start AGENT [-- CMD [ARG...]]",
		Short: "Start a session of an agent; prints its id",
		Long: `Start a session of an agent in the agent's execution strategy and print its id.
After --, a command to run instead of the agent's runtime. A session whose
strategy cannot run on this daemon is refused with the reason: never run in a
weaker boundary.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			positional, command := splitDash(cmd, args)
			if len(positional) != 1 {
				return fmt.Errorf("give one AGENT (and the command after --)")
			}
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, a adminv1.AdminClient) (*adminv1.Session, error) {
				return a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: positional[0], Command: command})
			}, sessionJSONOf, printID)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session as JSON")
	return cmd
}

func newSessionResumeCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Run a stopped session again (same id, its log continues)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, a adminv1.AdminClient) (*adminv1.Session, error) {
				return a.ResumeSession(ctx, &adminv1.ResumeSessionRequest{Id: args[0]})
			}, sessionJSONOf, printID)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session as JSON")
	return cmd
}

func newSessionListCommand(g *globals) *cobra.Command {
	var asJSON bool
	var agentName string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sessions",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, a adminv1.AdminClient) (*adminv1.ListSessionsResponse, error) {
				return a.ListSessions(ctx, &adminv1.ListSessionsRequest{Agent: agentName})
			}, func(resp *adminv1.ListSessionsResponse) any {
				out := []sessionJSON{}
				for _, s := range resp.Sessions {
					out = append(out, sessionView(s))
				}
				return out
			}, func(w io.Writer, resp *adminv1.ListSessionsResponse) {
				rows := [][]string{{"ID", "AGENT", "STRATEGY", "STATE", "PID", "EXIT", "CREATED"}}
				for _, s := range resp.Sessions {
					exit := "-"
					if s.State != "running" {
						exit = strconv.Itoa(int(s.ExitCode))
					}
					rows = append(rows, []string{s.Id, s.Agent, s.Strategy, s.State, strconv.Itoa(int(s.Pid)), exit, ago(s.CreatedAt)})
				}
				table(w, rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&agentName, "agent", "", "only this agent's sessions")
	return cmd
}

func newSessionShowCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a session",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, a adminv1.AdminClient) (*adminv1.Session, error) {
				return a.GetSession(ctx, &adminv1.GetSessionRequest{Id: args[0]})
			}, sessionJSONOf, printSessionText)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printSessionText is `session show`'s text.
func printSessionText(w io.Writer, s *adminv1.Session) {
	fmt.Fprintf(w, "id:        %s\nagent:     %s\nstrategy:  %s\nstate:     %s\n", s.Id, s.Agent, s.Strategy, s.State)
	if s.State == "running" {
		fmt.Fprintf(w, "pid:       %d (shim %d)\n", s.Pid, s.ShimPid)
	} else {
		fmt.Fprintf(w, "exit code: %d\n", s.ExitCode)
	}
	if s.Reason != "" {
		fmt.Fprintf(w, "reason:    %s\n", s.Reason)
	}
	fmt.Fprintf(w, "run:       %d\ncommand:   %s\nworkspace: %s\noutput:    %d bytes\nlimits:    %s\n",
		s.Run, strings.Join(s.Command, " "), s.Workspace, s.OutputBytes, s.Limits)
	if s.RunAs != "" {
		fmt.Fprintf(w, "runs as:   %s\n", s.RunAs)
	}
	if s.NativeSandbox != "" {
		fmt.Fprintf(w, "native sandbox: %s\n", s.NativeSandbox)
	}
	if u := s.Usage; u != nil {
		fmt.Fprintf(w, "usage:     %.1f MiB memory, %d pids, %.2f s cpu\n", float64(u.MemoryBytes)/(1<<20), u.Pids, float64(u.CpuUsageNs)/1e9)
	}
	fmt.Fprintf(w, "created:   %s\n", timeString(s.CreatedAt))
	printViolations(w, s)
}

// shownViolations is how many kinds of refusal `session show` prints;
// --json has them all.
const shownViolations = 20

// printViolations prints the refusals of a session: the count, and the
// kinds seen last, each with its count.
func printViolations(w io.Writer, s *adminv1.Session) {
	if s.ViolationCount == 0 {
		return
	}
	fmt.Fprintf(w, "violations: %d (connections refused, files written that host tools run), %d kinds; the latest:\n", s.ViolationCount, len(s.Violations))
	shown := s.Violations[max(0, len(s.Violations)-shownViolations):]
	for _, v := range shown {
		dest := v.Host
		if v.Port != 0 {
			dest = net.JoinHostPort(v.Host, strconv.Itoa(int(v.Port)))
		}
		times := "once"
		if v.Count > 1 {
			times = fmt.Sprintf("%d times since %s", v.Count, timeString(v.FirstTime))
		}
		fmt.Fprintf(w, "  %s  %s %s  %s  (%s)\n", timeString(v.Time), v.Protocol, dest, v.Reason, times)
	}
	if n := len(s.Violations) - len(shown); n > 0 {
		fmt.Fprintf(w, "  and %d earlier kinds (--json lists them)\n", n)
	}
	if s.ViolationsNotKept > 0 {
		fmt.Fprintf(w, "  and %d refusals of further kinds, counted but not kept\n", s.ViolationsNotKept)
	}
}

func newSessionAttachCommand(g *globals) *cobra.Command {
	var from uint64
	var withStdin bool
	cmd := &cobra.Command{
		Use:   "attach ID",
		Short: "Print a session's output from an offset, then follow it",
		Long: `Print the session's output (stdout to stdout, stderr to stderr) from --from, a
byte offset of its output log (0, the default, replays everything), then follow
it until the run ends. A daemon restart does not interrupt it: it reconnects and
carries on from where it was. With --stdin, this terminal's input goes to the
runtime, and its end closes the runtime's stdin.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if withStdin {
				go forwardStdin(cmd.Context(), g, args[0], os.Stdin, cmd.ErrOrStderr())
			}
			f := &follower{g: g, id: args[0], offset: from, follow: true, stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr()}
			return f.run(cmd.Context())
		},
	}
	cmd.Flags().Uint64Var(&from, "from", 0, "the output offset to start from (a record boundary: 0 or an outputBytes value)")
	cmd.Flags().BoolVarP(&withStdin, "stdin", "i", false, "send this terminal's input to the runtime")
	return cmd
}

func newSessionLogsCommand(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Print a session's whole output",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := &follower{g: g, id: args[0], follow: follow, stdout: cmd.OutOrStdout(), stderr: cmd.ErrOrStderr()}
			return f.run(cmd.Context())
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing until the run ends")
	return cmd
}

func newSessionStopCommand(g *globals) *cobra.Command {
	var timeout uint32
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stop ID",
		Short: "End a session's run (SIGTERM, then SIGKILL) and keep the session",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, a adminv1.AdminClient) (*adminv1.Session, error) {
				return a.StopSession(ctx, &adminv1.StopSessionRequest{Id: args[0], TimeoutSeconds: timeout})
			}, sessionJSONOf, printID)
		},
	}
	cmd.Flags().Uint32VarP(&timeout, "timeout", "t", 10, "seconds to wait after SIGTERM before SIGKILL")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session as JSON")
	return cmd
}

func newSessionKillCommand(g *globals) *cobra.Command {
	var signal string
	cmd := &cobra.Command{
		Use:   "kill ID",
		Short: "Send a signal to a session's runtime",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sig, err := parseSignal(signal)
			if err != nil {
				return err
			}
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.admin.KillSession(cmd.Context(), &adminv1.KillSessionRequest{Id: args[0], Signal: uint32(sig)})
			return err
		},
	}
	cmd.Flags().StringVarP(&signal, "signal", "s", "KILL", "the signal: a name (TERM, SIGINT) or a number")
	return cmd
}

// parseSignal reads a signal name (TERM, SIGTERM) or number.
func parseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal %d: want 1 to 64", n)
		}
		return syscall.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, fmt.Errorf("unknown signal %q", s)
}

func newSessionWaitCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait until a session is not running; print its exit code",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := waitSession(cmd.Context(), g, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), sessionView(s))
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.ExitCode)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the session as JSON")
	return cmd
}

func newSessionRemoveCommand(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "rm ID",
		Aliases: []string{"remove"},
		Short:   "Remove a session and everything it owns",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.admin.RemoveSession(cmd.Context(), &adminv1.RemoveSessionRequest{Id: args[0], Force: force})
			return err
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "kill the session first if it runs")
	return cmd
}
