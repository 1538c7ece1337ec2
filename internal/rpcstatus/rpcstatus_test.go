package rpcstatus

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind error
		code codes.Code
	}{
		{errdefs.NotFound("no agent named %q", "x"), errdefs.ErrNotFound, codes.NotFound},
		{fmt.Errorf("start: %w", errdefs.FailedPrecondition("sandbox.srt is off on this daemon")), errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
		{errdefs.InvalidArgument("bad"), errdefs.ErrInvalidArgument, codes.InvalidArgument},
		{errdefs.AlreadyExists("dup"), errdefs.ErrAlreadyExists, codes.AlreadyExists},
		{errdefs.Unavailable("busy"), errdefs.ErrUnavailable, codes.Unavailable},
		{errdefs.PermissionDenied("no"), errdefs.ErrPermissionDenied, codes.PermissionDenied},
		{errdefs.ResourceExhausted("full"), errdefs.ErrResourceExhausted, codes.ResourceExhausted},
	} {
		st := ToStatus(tc.err)
		if got := status.Code(st); got != tc.code {
			t.Errorf("ToStatus(%v) code = %v, want %v", tc.err, got, tc.code)
		}
		back := FromStatus(st)
		if !errors.Is(back, tc.kind) {
			t.Errorf("FromStatus(%v) is not %v", st, tc.kind)
		}
		if back.Error() != tc.err.Error() {
			t.Errorf("message = %q, want %q", back.Error(), tc.err.Error())
		}
	}
	if got := status.Code(ToStatus(errors.New("plain"))); got != codes.Unknown {
		t.Errorf("plain error code = %v, want Unknown", got)
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil {
		t.Error("nil does not map to nil")
	}
}

// TestCodesAreGRPCs keeps errdefs' numbers those of gRPC, which the ttrpc
// library and the shim's lighter server both send.
func TestCodesAreGRPCs(t *testing.T) {
	for c, want := range map[errdefs.Code]codes.Code{
		errdefs.CodeOK: codes.OK, errdefs.CodeCanceled: codes.Canceled, errdefs.CodeUnknown: codes.Unknown,
		errdefs.CodeInvalidArgument: codes.InvalidArgument, errdefs.CodeDeadlineExceeded: codes.DeadlineExceeded,
		errdefs.CodeNotFound: codes.NotFound, errdefs.CodeAlreadyExists: codes.AlreadyExists,
		errdefs.CodePermissionDenied: codes.PermissionDenied, errdefs.CodeResourceExhausted: codes.ResourceExhausted,
		errdefs.CodeFailedPrecondition: codes.FailedPrecondition, errdefs.CodeUnimplemented: codes.Unimplemented,
		errdefs.CodeUnavailable: codes.Unavailable,
	} {
		if uint32(c) != uint32(want) {
			t.Errorf("errdefs code %d is gRPC's %v (%d)", c, want, want)
		}
	}
}
