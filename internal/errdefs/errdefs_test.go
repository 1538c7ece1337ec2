package errdefs

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind error
		code codes.Code
	}{
		{NotFound("no agent named %q", "x"), ErrNotFound, codes.NotFound},
		{fmt.Errorf("start: %w", FailedPrecondition("sandbox.srt is off on this daemon")), ErrFailedPrecondition, codes.FailedPrecondition},
		{InvalidArgument("bad"), ErrInvalidArgument, codes.InvalidArgument},
		{AlreadyExists("dup"), ErrAlreadyExists, codes.AlreadyExists},
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
