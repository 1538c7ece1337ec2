// Package rpcstatus turns the kinds of internal/errdefs into the gRPC status
// errors of the ttrpc library and back, for the APIs served with it (admin,
// vmagent). The shim API does without it (internal/ttrpclite).
package rpcstatus

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// ToStatus turns err into a status error for the wire, keeping its message.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Code(errdefs.CodeOf(err)), err.Error())
}

// FromStatus turns a status error from the wire back into an error of its kind
// whose text is the server's message alone.
func FromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	return errdefs.FromCode(errdefs.Code(st.Code()), st.Message())
}
