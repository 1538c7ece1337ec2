package vmtransport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// Dialer opens a new connection to the guest agent. VsockDialer and
// *SerialClient implement it.
type Dialer interface {
	Dial(ctx context.Context) (net.Conn, error)
}

// DefaultRetryEvery is how often DialWithRetry tries by default: the guest
// takes seconds to boot under TCG, a dial costs almost nothing.
const DefaultRetryEvery = 100 * time.Millisecond

// DialWithRetry dials with d every `every` (DefaultRetryEvery if zero) until
// a dial succeeds or ctx ends; bound it with a context deadline. It gives up
// at once on errors that retrying cannot fix: ErrNoVsock, and net.ErrClosed
// (a SerialClient that was closed or lost its session).
func DialWithRetry(ctx context.Context, d Dialer, every time.Duration) (net.Conn, error) {
	if every <= 0 {
		every = DefaultRetryEvery
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	// last is the last error that says why a dial failed: one cut short by
	// the deadline says only that. The dialer's copy of the deadline can fire
	// before ctx.Err() is set, so a timeout counts as cut short by itself.
	var last error
	for attempt := 1; ; attempt++ {
		conn, err := d.Dial(ctx)
		if err == nil {
			return conn, nil
		}
		if errors.Is(err, ErrNoVsock) || errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if last == nil || !cutShort(ctx, err) {
			last = err
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dial the guest agent: gave up after %d attempts: %w; last: %w", attempt, ctx.Err(), last)
		}
		timer.Reset(every)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial the guest agent: gave up after %d attempts: %w; last: %w", attempt, ctx.Err(), last)
		case <-timer.C:
		}
	}
}

func cutShort(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
