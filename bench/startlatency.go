package main

import (
	"context"
	"fmt"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

const startWarmup = 5

// benchStartLatency times StartSession through the admin API to the first
// output chunk of the runtime (/bin/echo x, host strategy), removing each
// session afterwards.
func benchStartLatency(ctx context.Context, d *daemon, c counts, rep *report) error {
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	var lat samples
	for i := 0; i < startWarmup+c.Starts; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		took, err := startToFirstByte(ctx, a)
		if err != nil {
			return fmt.Errorf("start %d: %w", i+1, err)
		}
		if i >= startWarmup {
			lat.add(took)
		}
	}
	const m = "start -> first output byte (host, admin API)"
	ref := fmt.Sprintf("n=%d after %d warm-up starts; /bin/echo x", len(lat), startWarmup)
	rep.add(m, "p50", lat.percentile(50), "ms", 10, ref)
	rep.add(m, "p99", lat.percentile(99), "ms", 0, "")
	rep.add(m, "min", lat.min(), "ms", 0, "")
	rep.add(m, "max", lat.max(), "ms", 0, "")
	return nil
}

// startToFirstByte is one start: StartSession, Attach from offset 0 with
// follow, the first chunk; then the session is removed (not timed).
func startToFirstByte(ctx context.Context, a *admin) (took time.Duration, err error) {
	took, s, err := firstByte(ctx, a, benchAgent)
	if s != nil {
		_, rmErr := a.RemoveSession(context.WithoutCancel(ctx), &adminv1.RemoveSessionRequest{Id: s.Id, Force: true})
		if rmErr != nil && err == nil {
			err = fmt.Errorf("remove session %s: %w", s.Id, rmErr)
		}
	}
	return took, err
}

// firstByte starts a session of agent with its own command and times it to
// the first chunk of output. It returns the session whenever it started,
// for the caller to remove.
func firstByte(ctx context.Context, a *admin, agent string) (time.Duration, *adminv1.Session, error) {
	t0 := time.Now()
	s, err := a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: agent})
	if err != nil {
		return 0, nil, fmt.Errorf("start session: %w", err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := a.Attach(actx, &adminv1.AttachRequest{Id: s.Id, Offset: 0, Follow: true})
	if err != nil {
		return 0, s, fmt.Errorf("attach: %w", err)
	}
	chunk, err := stream.Recv()
	took := time.Since(t0)
	if err != nil {
		return 0, s, fmt.Errorf("attach: first chunk: %w", err)
	}
	if len(chunk.Data) == 0 {
		return 0, s, fmt.Errorf("attach: the first chunk is empty (offset %d, stream %v)", chunk.Offset, chunk.Stream)
	}
	return took, s, nil
}
