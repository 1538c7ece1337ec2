package vmtransport

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDialWithRetryWaitsForLateListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "late.sock")
	go func() {
		time.Sleep(300 * time.Millisecond)
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { ln.Close() })
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := DialWithRetry(ctx, unixDialer(path), 20*time.Millisecond)
	if err != nil {
		t.Fatalf("DialWithRetry = %v, want a connection once the listener appears", err)
	}
	conn.Close()
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("connected after %v, before the listener existed", d)
	}
}

func TestDialWithRetryGivesUpWithCtx(t *testing.T) {
	path := filepath.Join(t.TempDir(), "never.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := DialWithRetry(ctx, unixDialer(path), 20*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("DialWithRetry = %v, want the deadline and the last dial error", err)
	}
	if !strings.Contains(err.Error(), "attempts") {
		t.Errorf("error %q does not say how many attempts were made", err)
	}
}

type countingDialer struct {
	n   int
	err error
}

func (d *countingDialer) Dial(context.Context) (net.Conn, error) {
	d.n++
	return nil, d.err
}

func TestDialWithRetryStopsOnPermanentErrors(t *testing.T) {
	for _, perm := range []error{ErrNoVsock, net.ErrClosed} {
		d := &countingDialer{err: perm}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := DialWithRetry(ctx, d, time.Millisecond)
		cancel()
		if !errors.Is(err, perm) || d.n != 1 {
			t.Errorf("DialWithRetry with %v: %v after %d dials, want the error after 1", perm, err, d.n)
		}
	}
}

// timeoutAfterFirst fails its first dial with ENOENT and every later one as a
// dial whose own copy of the deadline fired while ctx.Err() is still nil.
type timeoutAfterFirst struct{ n int }

func (d *timeoutAfterFirst) Dial(context.Context) (net.Conn, error) {
	d.n++
	if d.n == 1 {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.ErrNotExist}
	}
	return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.ErrDeadlineExceeded}
}

func TestDialWithRetryKeepsTheTellingError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	d := &timeoutAfterFirst{}
	_, err := DialWithRetry(ctx, d, 10*time.Millisecond)
	if d.n < 2 || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DialWithRetry = %v after %d dials, want the first dial's ENOENT, not a later timeout", err, d.n)
	}
}
