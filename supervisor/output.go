package supervisor

import (
	"context"
	"errors"
	"io"
	"os"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/filewatch"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
)

// attach streams a session's output log from offset. With follow it goes on
// until the run ends (and everything it wrote is sent), the session is
// removed, or the client goes away. Output comes from the log file, never
// through the shim's control connection. Recorded stdin is sent only when
// asked for (withStdin).
func (s *Supervisor) attach(ctx context.Context, id string, offset int64, follow, withStdin bool, send func(*adminv1.OutputChunk) error) error {
	ss, err := s.lookupSession(id)
	if err != nil {
		return err
	}
	path := ss.dir.OutputPath()
	var w *filewatch.Watcher
	if follow {
		// Watch before the first read, so no write in between is missed.
		if w, err = filewatch.Watch(path); err != nil {
			return err
		}
		// Closing an inotify instance waits for an RCU grace period
		// (10-20 ms here): not on the way of the stream's end.
		defer func() { go w.Close() }()
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := outputlog.Check(f, offset, fi.Size()); err != nil {
		return errdefs.InvalidArgument("session %s: %v: attach from 0, or from a nextOffset it gave before", ss.id, err)
	}
	r := outputlog.NewReader(f, offset)
	ending := false // the run has ended: read to the end once more, then stop
	for {
		rec, err := r.Next()
		if err == nil {
			if rec.Stream == outputlog.Stdin && !withStdin {
				continue
			}
			if err := send(&adminv1.OutputChunk{
				Offset: uint64(rec.Offset), NextOffset: uint64(rec.Next()),
				Stream: adminv1.Stream(rec.Stream), Data: rec.Data,
			}); err != nil {
				return err
			}
			continue
		}
		if !errors.Is(err, io.EOF) {
			return err
		}
		if !follow || ending {
			return nil
		}
		// The shim drains the output before it records the exit, so once
		// the session is not running, what is in the log is all there is.
		state, removed, changed := ss.watch()
		if state != session.Running || removed {
			ending = true
			continue
		}
		select {
		case <-w.C:
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
