// Package errdefs holds the few kinds of error the daemon returns and the
// status codes they travel as, in one place (package rpcstatus turns them
// into the gRPC statuses of the ttrpc library).
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
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

// Code is the gRPC status code an error travels as on a ttrpc connection
// (the numbers of google.golang.org/grpc/codes, which this package does not
// link: the shim speaks the wire protocol without the gRPC runtime).
type Code uint32

// The codes the kinds travel as, and the few the wire itself uses.
const (
	CodeOK                 Code = 0
	CodeCanceled           Code = 1
	CodeUnknown            Code = 2
	CodeInvalidArgument    Code = 3
	CodeDeadlineExceeded   Code = 4
	CodeNotFound           Code = 5
	CodeAlreadyExists      Code = 6
	CodePermissionDenied   Code = 7
	CodeResourceExhausted  Code = 8
	CodeFailedPrecondition Code = 9
	CodeUnimplemented      Code = 12
	CodeUnavailable        Code = 14
)

var kinds = []struct {
	kind error
	code Code
}{
	{ErrInvalidArgument, CodeInvalidArgument},
	{ErrNotFound, CodeNotFound},
	{ErrAlreadyExists, CodeAlreadyExists},
	{ErrFailedPrecondition, CodeFailedPrecondition},
	{ErrUnavailable, CodeUnavailable},
	{ErrPermissionDenied, CodePermissionDenied},
	{ErrResourceExhausted, CodeResourceExhausted},
	{context.Canceled, CodeCanceled},
	{context.DeadlineExceeded, CodeDeadlineExceeded},
}

// CodeOf is the code err travels as: its kind's, CodeUnknown for an error
// of no kind, CodeOK for nil.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	for _, k := range kinds {
		if errors.Is(err, k.kind) {
			return k.code
		}
	}
	return CodeUnknown
}

// FromCode is the error a peer sent as code and message: of the code's kind,
// with the peer's message as its whole text.
func FromCode(code Code, msg string) error {
	if code == CodeOK {
		return nil
	}
	for _, k := range kinds {
		if code == k.code {
			return &kindError{kind: k.kind, msg: msg}
		}
	}
	return errors.New(msg)
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
