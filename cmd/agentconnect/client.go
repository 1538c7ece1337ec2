package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// dialTimeout bounds connecting to the daemon.
const dialTimeout = 2 * time.Second

// callTimeout bounds a call that has no deadline of its own, so that a
// daemon that accepts connections but does not answer cannot hang the CLI.
// WaitSession is exempt: it waits for as long as the session runs.
const callTimeout = 2 * time.Minute

// startCallTimeout bounds StartSession and ResumeSession, whose answer
// waits for the run's start: the daemon bounds that by the shims' own
// StartTimeout (a VM's boot among it), so the CLI waits that long and a
// call longer. A shorter bound let a slow VM start under load fail the CLI
// with "context deadline exceeded" while the daemon went on starting it.
const startCallTimeout = shimv1.StartTimeout + callTimeout

// errNoDaemon is returned when nothing answers on the admin socket.
type errNoDaemon struct {
	socket string
	err    error
}

func (e *errNoDaemon) Error() string {
	return fmt.Sprintf("no daemon is answering on %s (%v): start one with `agentconnect run`, or check `agentconnect status`", e.socket, e.err)
}

// client is a connection to the daemon.
type client struct {
	conn  *ttrpc.Client
	admin adminv1.AdminClient
	// gone is set once the connection ended (the daemon went away): a call
	// on it could not reach the daemon.
	gone atomic.Bool
}

func (c *client) Close() { c.conn.Close() }

func dial(ctx context.Context, socket string) (*client, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, &errNoDaemon{socket: socket, err: unwrapSyscall(err)}
	}
	cl := &client{}
	cl.conn = ttrpc.NewClient(conn, ttrpc.WithUnaryClientInterceptor(boundedCall), ttrpc.WithOnClose(func() { cl.gone.Store(true) }))
	cl.admin = adminv1.NewAdminClient(cl.conn)
	return cl, nil
}

func boundedCall(ctx context.Context, req *ttrpc.Request, resp *ttrpc.Response, info *ttrpc.UnaryClientInfo, invoke ttrpc.Invoker) error {
	if _, ok := ctx.Deadline(); !ok {
		if bound := callBound(info.FullMethod); bound > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, bound)
			defer cancel()
		}
	}
	return invoke(ctx, req, resp)
}

// callBound is how long the CLI waits for a call without a deadline of its
// own; 0: as long as it takes.
func callBound(method string) time.Duration {
	switch method[strings.LastIndexByte(method, '/')+1:] {
	case "WaitSession":
		return 0
	case "StartSession", "ResumeSession":
		return startCallTimeout
	}
	return callTimeout
}

// connect dials the daemon the global flags name.
func (g *globals) connect(ctx context.Context) (*client, error) {
	socket, err := g.socketPath()
	if err != nil {
		return nil, err
	}
	return dial(ctx, socket)
}

// callAndPrint is the shape of most commands: connect to the daemon, make
// one call, print what it answers, as JSON (asJSON: view's value) or as
// text.
func callAndPrint[T any](cmd *cobra.Command, g *globals, asJSON bool, call func(context.Context, adminv1.AdminClient) (T, error), view func(T) any, text func(io.Writer, T)) error {
	c, err := g.connect(cmd.Context())
	if err != nil {
		return err
	}
	defer c.Close()
	v, err := call(cmd.Context(), c.admin)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(cmd.OutOrStdout(), view(v))
	}
	text(cmd.OutOrStdout(), v)
	return nil
}

// printID prints a session's id, as `session start` and the like do.
func printID(w io.Writer, s *adminv1.Session) { fmt.Fprintln(w, s.Id) }

// sessionJSONOf is a session's --json view.
func sessionJSONOf(s *adminv1.Session) any { return sessionView(s) }

func unwrapSyscall(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return err
}

// retryable reports whether an error means the daemon went away (a restart)
// rather than that it refused the request.
func retryable(err error) bool {
	var nd *errNoDaemon
	if errors.As(err, &nd) || errors.Is(err, ttrpc.ErrClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, ttrpc.ErrStreamFull) {
		return true
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable && st.Message() == ttrpc.ErrClosed.Error()
	}
	return false
}
