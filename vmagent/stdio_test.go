package vmagent

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// pipeConn is one end of a net.Pipe; the other is closed with the test.
func pipeConn(t *testing.T) net.Conn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a
}

func addStream(p *pendingStreams, id, kind string, c net.Conn) error {
	p.startReading()
	return p.add(id, kind, c)
}

func TestPendingStreamsTake(t *testing.T) {
	p := newPendingStreams(testLogf(t))
	out, errc := pipeConn(t), pipeConn(t)
	if err := addStream(p, "a", vmtransport.KindStdout, out); err != nil {
		t.Fatal(err)
	}
	if err := addStream(p, "a", vmtransport.KindStderr, errc); err != nil {
		t.Fatal(err)
	}
	got, err := p.take(context.Background(), "a", [3]bool{false, true, true}, time.Second)
	if err != nil || got[stdin] != nil || got[stdout] != out || got[stderr] != errc {
		t.Fatalf("take = %v, %v; want stdout and stderr", got, err)
	}
	if p.count != 0 || len(p.byID) != 0 {
		t.Errorf("after take: %d pending in %d ids, want none", p.count, len(p.byID))
	}
}

func TestPendingStreamsTakeWaitsForNamedAndReading(t *testing.T) {
	p := newPendingStreams(testLogf(t))
	in := pipeConn(t)
	p.startReading() // a preface is being read: it may be this Exec's stream
	go func() {
		time.Sleep(100 * time.Millisecond)
		p.add("b", vmtransport.KindStdin, in)
	}()
	start := time.Now()
	got, err := p.take(context.Background(), "b", [3]bool{}, 5*time.Second)
	if err != nil || got[stdin] != in {
		t.Fatalf("take = %v, %v; want the stdin stream whose preface was being read", got, err)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Error("take did not wait for the preface being read")
	}
}

func TestPendingStreamsTakeTimesOut(t *testing.T) {
	p := newPendingStreams(testLogf(t))
	a, b := net.Pipe()
	defer b.Close()
	addStream(p, "c", vmtransport.KindStdout, a)
	_, err := p.take(context.Background(), "c", [3]bool{true, true, false}, 50*time.Millisecond)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("take without the stdin named = %v, want failed-precondition", err)
	}
	b.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := b.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the stdout stream of a failed take: %v, want it closed", err)
	}
	if p.count != 0 {
		t.Errorf("%d streams still pending after a failed take", p.count)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.take(ctx, "d", [3]bool{true}, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("take with a cancelled context = %v", err)
	}
}

func TestPendingStreamsLimits(t *testing.T) {
	p := newPendingStreams(testLogf(t))
	p.max = 2
	if err := addStream(p, "e", vmtransport.KindStdout, pipeConn(t)); err != nil {
		t.Fatal(err)
	}
	if err := addStream(p, "e", vmtransport.KindStdout, pipeConn(t)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a second stdout of one process = %v, want already-exists", err)
	}
	addStream(p, "f", vmtransport.KindStdout, pipeConn(t))
	if err := addStream(p, "g", vmtransport.KindStdout, pipeConn(t)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a stream over the bound = %v, want resource-exhausted", err)
	}
	if p.reading != 0 {
		t.Errorf("reading = %d after the adds, want 0", p.reading)
	}
}

func TestPendingStreamsExpire(t *testing.T) {
	p := newPendingStreams(testLogf(t))
	p.expireAfter = 50 * time.Millisecond
	a, b := net.Pipe()
	defer b.Close()
	addStream(p, "h", vmtransport.KindStdout, a)
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := b.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a stream never claimed: %v, want it closed", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.count != 0 {
		t.Errorf("%d pending after expiry, want 0", p.count)
	}
}
