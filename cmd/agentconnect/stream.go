package main

import (
	"context"
	"errors"
	"io"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
)

const (
	// reconnectFor is how long a follower keeps trying to reach a daemon
	// that went away (a restart) before it gives up.
	reconnectFor = 30 * time.Second
	// reconnectEvery is the pause between those tries.
	reconnectEvery = 100 * time.Millisecond
)

// follower reads a session's output from an offset, and carries on from
// where it stopped when the daemon restarts or the stream is cut: no byte
// lost, none repeated.
type follower struct {
	g      *globals
	id     string
	offset uint64
	follow bool
	stdout io.Writer
	stderr io.Writer
}

// run copies the output until the run ends (follow) or the log's end.
func (f *follower) run(ctx context.Context) error {
	lastProgress := time.Now()
	for {
		err := f.once(ctx, &lastProgress)
		if err == nil {
			return nil
		}
		if !retryable(err) || ctx.Err() != nil {
			return err
		}
		if time.Since(lastProgress) > reconnectFor {
			return errors.New("lost the daemon and could not reach it again for " + reconnectFor.String() + ": " + err.Error())
		}
		select {
		case <-time.After(reconnectEvery):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *follower) once(ctx context.Context, lastProgress *time.Time) error {
	c, err := f.g.connect(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	*lastProgress = time.Now()
	stream, err := c.admin.Attach(ctx, &adminv1.AttachRequest{Id: f.id, Offset: f.offset, Follow: f.follow})
	if err != nil {
		return err
	}
	for {
		chunk, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		w := f.stdout
		if chunk.Stream == adminv1.Stream_STDERR {
			w = f.stderr
		}
		if _, err := w.Write(chunk.Data); err != nil {
			return err
		}
		f.offset = chunk.NextOffset
		*lastProgress = time.Now()
	}
}
