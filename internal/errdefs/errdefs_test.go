package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestCodeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind error
		code Code
	}{
		{NotFound("no agent named %q", "x"), ErrNotFound, CodeNotFound},
		{fmt.Errorf("start: %w", FailedPrecondition("sandbox.srt is off on this daemon")), ErrFailedPrecondition, CodeFailedPrecondition},
		{InvalidArgument("bad"), ErrInvalidArgument, CodeInvalidArgument},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), context.DeadlineExceeded, CodeDeadlineExceeded},
	} {
		if got := CodeOf(tc.err); got != tc.code {
			t.Errorf("CodeOf(%v) = %d, want %d", tc.err, got, tc.code)
		}
		back := FromCode(CodeOf(tc.err), tc.err.Error())
		if !errors.Is(back, tc.kind) || back.Error() != tc.err.Error() {
			t.Errorf("FromCode(%d, %q) = %v, want an error of kind %v with the same text", tc.code, tc.err, back, tc.kind)
		}
	}
	if CodeOf(errors.New("plain")) != CodeUnknown || CodeOf(nil) != CodeOK || FromCode(CodeOK, "") != nil {
		t.Error("plain errors are not Unknown, or nil does not map to OK")
	}
	if err := FromCode(CodeUnimplemented, "method X"); err == nil || err.Error() != "method X" {
		t.Errorf("a code of no kind: %v, want an error with the message", err)
	}
}

func TestClip(t *testing.T) {
	if got := Clip("héllo", 2); got != "h…" {
		t.Errorf("Clip at a rune's middle = %q, want %q", got, "h…")
	}
	if got := Clip("abc", 5); got != "abc" {
		t.Errorf("Clip of a short text = %q", got)
	}
}
