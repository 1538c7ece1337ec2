package main

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// deadlineOf makes one call through boundedCall and returns how far off its
// deadline was when the call went out (0: none).
func deadlineOf(t *testing.T, ctx context.Context, method string) time.Duration {
	t.Helper()
	var left time.Duration
	invoke := func(ctx context.Context, _ *ttrpc.Request, _ *ttrpc.Response) error {
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		return nil
	}
	info := &ttrpc.UnaryClientInfo{FullMethod: "/agentconnect.admin.v1.Admin/" + method}
	if err := boundedCall(ctx, &ttrpc.Request{}, &ttrpc.Response{}, info, invoke); err != nil {
		t.Fatal(err)
	}
	return left
}

// A start is answered within the shims' StartTimeout (the daemon waits that
// long for a VM's boot); the CLI must not give up first.
func TestCallBounds(t *testing.T) {
	for _, m := range []string{"StartSession", "ResumeSession"} {
		if got := deadlineOf(t, context.Background(), m); got <= shimv1.StartTimeout {
			t.Errorf("%s: the CLI waits %v, not longer than a shim's start may take (%v)", m, got, shimv1.StartTimeout)
		}
	}
	if got := deadlineOf(t, context.Background(), "WaitSession"); got != 0 {
		t.Errorf("WaitSession: bounded by %v; it waits as long as the session runs", got)
	}
	if got := deadlineOf(t, context.Background(), "Status"); got <= 0 || got > callTimeout {
		t.Errorf("Status: bounded by %v, want at most %v", got, callTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if got := deadlineOf(t, ctx, "StartSession"); got <= 0 || got > time.Second {
		t.Errorf("StartSession with the caller's own deadline of 1s: bounded by %v", got)
	}
}
