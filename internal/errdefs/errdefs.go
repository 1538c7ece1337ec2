// Package errdefs holds the few kinds of error the daemon returns and maps
// them to and from ttrpc status codes in one place.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kinds. Test an error with errors.Is(err, errdefs.ErrNotFound).
var (
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrResourceExhausted  = errors.New("resource exhausted")
)

// kindError is an error of one kind whose text is written for a person: the
// kind is for code, the message is what the user reads.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string        { return e.msg }
func (e *kindError) Is(target error) bool { return target == e.kind }

func newf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// InvalidArgument returns an error of kind ErrInvalidArgument.
func InvalidArgument(format string, args ...any) error {
	return newf(ErrInvalidArgument, format, args...)
}

// NotFound returns an error of kind ErrNotFound.
func NotFound(format string, args ...any) error { return newf(ErrNotFound, format, args...) }

// AlreadyExists returns an error of kind ErrAlreadyExists.
func AlreadyExists(format string, args ...any) error {
	return newf(ErrAlreadyExists, format, args...)
}

// FailedPrecondition returns an error of kind ErrFailedPrecondition.
func FailedPrecondition(format string, args ...any) error {
	return newf(ErrFailedPrecondition, format, args...)
}

// Unavailable returns an error of kind ErrUnavailable.
func Unavailable(format string, args ...any) error { return newf(ErrUnavailable, format, args...) }

// PermissionDenied returns an error of kind ErrPermissionDenied.
func PermissionDenied(format string, args ...any) error {
	return newf(ErrPermissionDenied, format, args...)
}

// ResourceExhausted returns an error of kind ErrResourceExhausted.
func ResourceExhausted(format string, args ...any) error {
	return newf(ErrResourceExhausted, format, args...)
}

var kinds = []struct {
	kind error
	code codes.Code
}{
	{ErrInvalidArgument, codes.InvalidArgument},
	{ErrNotFound, codes.NotFound},
	{ErrAlreadyExists, codes.AlreadyExists},
	{ErrFailedPrecondition, codes.FailedPrecondition},
	{ErrUnavailable, codes.Unavailable},
	{ErrPermissionDenied, codes.PermissionDenied},
	{ErrResourceExhausted, codes.ResourceExhausted},
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

// ToStatus turns err into a status error for the wire, keeping its message.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			return status.Error(k.code, err.Error())
		}
	}
	return status.Error(codes.Unknown, err.Error())
}

// FromStatus turns a status error from the wire back into an error of its kind
// whose text is the server's message alone.
func FromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	for _, k := range kinds {
		if st.Code() == k.code {
			return &kindError{kind: k.kind, msg: st.Message()}
		}
	}
	return errors.New(st.Message())
}

// Clip shortens text quoted in an error (what a tool printed) to at most n
// bytes, at a rune boundary, marking the cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
