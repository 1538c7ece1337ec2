package supervisor

import (
	"context"
	"fmt"
	"time"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// forwardConn is the connection to session id's shim for a forward: the
// session must run, and its shim speak the forward calls.
func (s *Supervisor) forwardConn(id string) (*sessionState, *shimConn, error) {
	ss, err := s.lookupSession(id)
	if err != nil {
		return nil, nil, err
	}
	conn := ss.connection()
	if !ss.isRunning() || conn == nil {
		return nil, nil, errdefs.FailedPrecondition("session %s is not running: a forward reaches into a running session (session resume %s)", ss.id, ss.id)
	}
	if conn.apiVersion < shimv1.ForwardAPIVersion {
		return nil, nil, errdefs.FailedPrecondition("session %s runs under a shim of an earlier release (shim API %d), which cannot forward: stop and resume it", ss.id, conn.apiVersion)
	}
	return ss, conn, nil
}

// forward opens a forward from the host's loopback (hostPort, 0 for any)
// to port inside session id and sends it. A detached one stays until
// unforward or the run's end; another one lasts while ctx does (the
// command that asked for it) and the run goes on, and is closed after.
func (s *Supervisor) forward(ctx context.Context, id string, hostPort, port uint32, detach bool, send func(*shimv1.Forward) error) error {
	ss, conn, err := s.forwardConn(id)
	if err != nil {
		return err
	}
	resp, err := conn.shim.Forward(ctx, &shimv1.ForwardRequest{HostPort: hostPort, Port: port, Detach: detach})
	if err != nil {
		return err
	}
	f := resp.Forward
	s.sessionLog(ss).WithField("forward", f.Address).WithField("port", f.Port).Info("forward opened")
	if err := send(f); err != nil || detach {
		if err != nil && !detach {
			s.unforward(ss, f.Address)
		}
		return err
	}
	ss.wait(ctx) // until the run ends, or the command goes
	if ss.isRunning() {
		s.unforward(ss, f.Address)
	}
	return nil
}

// unforward closes a forward of ss whose command went away.
func (s *Supervisor) unforward(ss *sessionState, address string) {
	conn := ss.connection()
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	if _, err := conn.shim.Unforward(ctx, &shimv1.UnforwardRequest{Address: address}); err != nil {
		s.sessionLog(ss).WithError(err).WithField("forward", address).Warn("close the forward of a command that went away")
	}
}

// closeForwards closes session id's forward at address, or with all every
// one, and says how many.
func (s *Supervisor) closeForwards(ctx context.Context, id, address string, all bool) (int, error) {
	_, conn, err := s.forwardConn(id)
	if err != nil {
		return 0, err
	}
	if (address == "") == !all {
		return 0, errdefs.InvalidArgument("unforward: name the forward's host port, or all")
	}
	if all {
		l, err := conn.shim.ListForwards(ctx, &shimv1.ListForwardsRequest{})
		if err != nil {
			return 0, err
		}
		n := 0
		for _, f := range l.Forwards {
			if _, err := conn.shim.Unforward(ctx, &shimv1.UnforwardRequest{Address: f.Address}); err == nil {
				n++
			}
		}
		return n, nil
	}
	resp, err := conn.shim.Unforward(ctx, &shimv1.UnforwardRequest{Address: address})
	if err != nil {
		return 0, err
	}
	return int(resp.Closed), nil
}

// listForwards lists session id's forwards.
func (s *Supervisor) listForwards(ctx context.Context, id string) ([]*shimv1.Forward, error) {
	_, conn, err := s.forwardConn(id)
	if err != nil {
		return nil, err
	}
	resp, err := conn.shim.ListForwards(ctx, &shimv1.ListForwardsRequest{})
	if err != nil {
		return nil, fmt.Errorf("session %s: list its forwards: %w", id, err)
	}
	return resp.Forwards, nil
}
