package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

// forwardJSON is a forward's --json view.
type forwardJSON struct {
	Session     string `json:"session"`
	Address     string `json:"address"`
	HostPort    int    `json:"hostPort"`
	Port        int    `json:"port"`
	Detached    bool   `json:"detached"`
	Connections uint64 `json:"connections"`
}

func forwardView(session string, f *adminv1.SessionForward) forwardJSON {
	return forwardJSON{Session: session, Address: f.Address, HostPort: int(f.HostPort), Port: int(f.Port), Detached: f.Detached, Connections: f.Connections}
}

// parseForward reads [HOSTPORT:]PORT.
func parseForward(spec string) (hostPort, port uint32, err error) {
	h, p, two := strings.Cut(spec, ":")
	if !two {
		h, p = "0", h
	}
	hp, err1 := strconv.ParseUint(h, 10, 16)
	pp, err2 := strconv.ParseUint(p, 10, 16)
	if err1 != nil || err2 != nil || pp == 0 {
		return 0, 0, fmt.Errorf("forward %q: want PORT or HOSTPORT:PORT, ports from 1 to 65535 (the listener is always on 127.0.0.1)", spec)
	}
	return uint32(hp), uint32(pp), nil
}

func newSessionForwardCommand(g *globals) *cobra.Command {
	var detach, asJSON bool
	cmd := &cobra.Command{
		Use:   "forward ID [HOSTPORT:]PORT",
		Short: "Reach a server inside a running session from the host's loopback",
		Long: `Open a listener on 127.0.0.1:HOSTPORT (a free port when HOSTPORT is left out)
whose connections reach PORT inside the session: in srt, its own network
namespace's 127.0.0.1:PORT; in microsandbox, the guest's address (the server
must listen on 0.0.0.0 or the guest's address there, as behind any NAT). It is
never published beyond the host's loopback. The forward lasts as long as this
command runs (Ctrl-C ends it), and at most as long as the session's run; with
--detach it stays until session unforward or the run's end. Host sessions share
the host's network: nothing to forward.`,
		Example: `  agentconnect session forward 3f2a 8000          # 127.0.0.1:<free port> → the session's port 8000
  agentconnect session forward 3f2a 8080:8000     # 127.0.0.1:8080 → the session's port 8000
  agentconnect session forward 3f2a 8000 --detach # until session unforward`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			hostPort, port, err := parseForward(args[1])
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
			defer stop()
			c, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			stream, err := c.admin.Forward(ctx, &adminv1.ForwardRequest{Session: args[0], HostPort: hostPort, Port: port, Detach: detach})
			if err != nil {
				return err
			}
			f, err := stream.Recv()
			if err != nil {
				return err
			}
			if asJSON {
				printJSON(cmd.OutOrStdout(), forwardView(args[0], f))
			} else if detach {
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", f.Address)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "forwarding %s to port %d of session %s (Ctrl-C ends it)\n", f.Address, f.Port, args[0])
			}
			if detach {
				return nil
			}
			// The stream ends with the run, or when the daemon goes.
			_, err = stream.Recv()
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, io.EOF) && !sessionRunning(cmd.Context(), g, args[0]):
				fmt.Fprintf(cmd.ErrOrStderr(), "forward %s closed: session %s is not running any more\n", f.Address, args[0])
				return nil
			case errors.Is(err, io.EOF):
				return fmt.Errorf("forward %s closed: the daemon stopped or restarted, and session %s runs on: forward again", f.Address, args[0])
			default:
				return fmt.Errorf("forward %s closed: %w", f.Address, err)
			}
		},
	}
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "leave the forward open after this command, until session unforward or the run's end; prints its address")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the forward as JSON")
	return cmd
}

func newSessionForwardsCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "forwards ID",
		Short: "List a running session's forwards",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, a adminv1.AdminClient) (*adminv1.ListForwardsResponse, error) {
				return a.ListForwards(ctx, &adminv1.ListForwardsRequest{Session: args[0]})
			}, func(r *adminv1.ListForwardsResponse) any {
				out := []forwardJSON{}
				for _, f := range r.Forwards {
					out = append(out, forwardView(args[0], f))
				}
				return out
			}, func(w io.Writer, r *adminv1.ListForwardsResponse) {
				rows := [][]string{{"ADDRESS", "PORT", "DETACHED", "CONNECTIONS"}}
				for _, f := range r.Forwards {
					rows = append(rows, []string{f.Address, strconv.Itoa(int(f.Port)), strconv.FormatBool(f.Detached), strconv.FormatUint(f.Connections, 10)})
				}
				table(w, rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the forwards as a JSON list")
	return cmd
}

func newSessionUnforwardCommand(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "unforward ID HOSTPORT | unforward ID --all",
		Short: "Close a session's forward, or all of them",
		Args: func(cmd *cobra.Command, args []string) error {
			if all && len(args) == 1 || !all && len(args) == 2 {
				return nil
			}
			return errors.New("unforward takes a session id and a forward's host port, or a session id and --all")
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var hostPort uint64
			if !all {
				var err error
				if hostPort, err = strconv.ParseUint(strings.TrimPrefix(args[1], "127.0.0.1:"), 10, 16); err != nil || hostPort == 0 {
					return fmt.Errorf("host port %q: want the port of 127.0.0.1 the forward listens on (session forwards %s lists them)", args[1], args[0])
				}
			}
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.admin.Unforward(cmd.Context(), &adminv1.UnforwardRequest{Session: args[0], HostPort: uint32(hostPort), All: all})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d closed\n", resp.Closed)
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "close every forward of the session")
	return cmd
}

// sessionRunning asks the daemon (again: it may have restarted) whether
// session id runs; no answer within a few seconds is a no.
func sessionRunning(ctx context.Context, g *globals, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := g.connect(ctx)
	if err != nil {
		return false
	}
	defer c.Close()
	s, err := c.admin.GetSession(ctx, &adminv1.GetSessionRequest{Id: id})
	return err == nil && s.State == "running"
}
