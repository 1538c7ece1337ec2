package supervisor

import (
	"context"
	"time"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/supervisor/secret"
)

// renewPoll bounds one SecretUpdates call: the shim answers at a renewal,
// at the run's end, or then.
const renewPoll = time.Minute

// followRenewals stores the values a run's token endpoints renewed (OAuth
// tokens that a session refreshed through its proxy), as the shim reports
// them, until the run ends or the connection goes. Its channel is closed
// when it returns. A supervisor that adopts the shim again asks from the
// start: a renewal stored twice is stored once.
func (s *Supervisor) followRenewals(ss *sessionState, conn *shimConn) <-chan struct{} {
	done := make(chan struct{})
	if conn.apiVersion < shimv1.RenewAPIVersion || ss.record().Spec.Sandbox == nil {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		var gen uint64
		for s.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(s.ctx, renewPoll)
			resp, err := conn.shim.SecretUpdates(ctx, &shimv1.SecretUpdatesRequest{After: gen})
			cancel()
			if err != nil {
				return // the shim is gone, or so is its connection: monitor sees to it
			}
			if resp.Generation > gen {
				for _, u := range resp.Updates {
					log := s.sessionLog(ss).WithField("secret", u.Name)
					if err := s.secrets.Renew(u.Name, secret.Value(u.Value)); err != nil {
						log.WithError(err).Warn("a renewed secret could not be stored")
						continue
					}
					log.Info("secret renewed by a session")
				}
				gen = resp.Generation
			}
			if resp.Ended {
				return
			}
		}
	}()
	return done
}
