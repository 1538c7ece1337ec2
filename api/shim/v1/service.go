package shimv1

import (
	"context"
	"fmt"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
)

// ServiceName is the Shim service's ttrpc name, shim.proto's.
const ServiceName = "agentconnect.shim.v1.Shim"

// ShimService is the Shim service of shim.proto: what a shim serves and
// what NewShimClient calls.
type ShimService interface {
	Handshake(context.Context, *HandshakeRequest) (*HandshakeResponse, error)
	Start(context.Context, *StartRequest) (*StartResponse, error)
	State(context.Context, *StateRequest) (*StateResponse, error)
	Kill(context.Context, *KillRequest) (*KillResponse, error)
	Wait(context.Context, *WaitRequest) (*WaitResponse, error)
	WriteStdin(context.Context, *WriteStdinRequest) (*WriteStdinResponse, error)
	CloseStdin(context.Context, *CloseStdinRequest) (*CloseStdinResponse, error)
	Stats(context.Context, *StatsRequest) (*StatsResponse, error)
	Shutdown(context.Context, *ShutdownRequest) (*ShutdownResponse, error)
	SecretUpdates(context.Context, *SecretUpdatesRequest) (*SecretUpdatesResponse, error)
	Forward(context.Context, *ForwardRequest) (*ForwardResponse, error)
	Unforward(context.Context, *UnforwardRequest) (*UnforwardResponse, error)
	ListForwards(context.Context, *ListForwardsRequest) (*ListForwardsResponse, error)
}

// RegisterShimService serves svc on srv.
func RegisterShimService(srv *ttrpclite.Server, svc ShimService) {
	srv.Register(ServiceName, map[string]ttrpclite.Method{
		"Handshake":     method(svc.Handshake),
		"Start":         method(svc.Start),
		"State":         method(svc.State),
		"Kill":          method(svc.Kill),
		"Wait":          method(svc.Wait),
		"WriteStdin":    method(svc.WriteStdin),
		"CloseStdin":    method(svc.CloseStdin),
		"Stats":         method(svc.Stats),
		"Shutdown":      method(svc.Shutdown),
		"SecretUpdates": method(svc.SecretUpdates),
		"Forward":       method(svc.Forward),
		"Unforward":     method(svc.Unforward),
		"ListForwards":  method(svc.ListForwards),
	})
}

// pointer is a message type of this package behind its pointer.
type pointer[T any] interface {
	*T
	message
}

// method serves one call of svc on the wire.
func method[Req, Resp any, PReq pointer[Req], PResp pointer[Resp]](call func(context.Context, PReq) (PResp, error)) ttrpclite.Method {
	return func(ctx context.Context, data []byte) ([]byte, error) {
		req := PReq(new(Req))
		if err := unmarshal(data, req); err != nil {
			return nil, errdefs.InvalidArgument("shim API: a request that is not a %T: %v", req, err)
		}
		resp, err := call(ctx, req)
		if err != nil {
			return nil, err
		}
		return marshal(resp), nil
	}
}

// NewShimClient calls the Shim service on c.
func NewShimClient(c *ttrpclite.Client) ShimService { return shimClient{c} }

type shimClient struct{ c *ttrpclite.Client }

// call makes one call and decodes its response.
func call[Resp any, PResp pointer[Resp]](ctx context.Context, c *ttrpclite.Client, name string, req message) (PResp, error) {
	data, err := c.Call(ctx, ServiceName, name, marshal(req))
	if err != nil {
		return nil, err
	}
	resp := PResp(new(Resp))
	if err := unmarshal(data, resp); err != nil {
		return nil, fmt.Errorf("shim API: the answer to %s: %w", name, err)
	}
	return resp, nil
}

func (s shimClient) Handshake(ctx context.Context, req *HandshakeRequest) (*HandshakeResponse, error) {
	return call[HandshakeResponse](ctx, s.c, "Handshake", req)
}

func (s shimClient) Start(ctx context.Context, req *StartRequest) (*StartResponse, error) {
	return call[StartResponse](ctx, s.c, "Start", req)
}

func (s shimClient) State(ctx context.Context, req *StateRequest) (*StateResponse, error) {
	return call[StateResponse](ctx, s.c, "State", req)
}

func (s shimClient) Kill(ctx context.Context, req *KillRequest) (*KillResponse, error) {
	return call[KillResponse](ctx, s.c, "Kill", req)
}

func (s shimClient) Wait(ctx context.Context, req *WaitRequest) (*WaitResponse, error) {
	return call[WaitResponse](ctx, s.c, "Wait", req)
}

func (s shimClient) WriteStdin(ctx context.Context, req *WriteStdinRequest) (*WriteStdinResponse, error) {
	return call[WriteStdinResponse](ctx, s.c, "WriteStdin", req)
}

func (s shimClient) CloseStdin(ctx context.Context, req *CloseStdinRequest) (*CloseStdinResponse, error) {
	return call[CloseStdinResponse](ctx, s.c, "CloseStdin", req)
}

func (s shimClient) Stats(ctx context.Context, req *StatsRequest) (*StatsResponse, error) {
	return call[StatsResponse](ctx, s.c, "Stats", req)
}

func (s shimClient) Shutdown(ctx context.Context, req *ShutdownRequest) (*ShutdownResponse, error) {
	return call[ShutdownResponse](ctx, s.c, "Shutdown", req)
}

func (s shimClient) SecretUpdates(ctx context.Context, req *SecretUpdatesRequest) (*SecretUpdatesResponse, error) {
	return call[SecretUpdatesResponse](ctx, s.c, "SecretUpdates", req)
}

func (s shimClient) Forward(ctx context.Context, req *ForwardRequest) (*ForwardResponse, error) {
	return call[ForwardResponse](ctx, s.c, "Forward", req)
}

func (s shimClient) Unforward(ctx context.Context, req *UnforwardRequest) (*UnforwardResponse, error) {
	return call[UnforwardResponse](ctx, s.c, "Unforward", req)
}

func (s shimClient) ListForwards(ctx context.Context, req *ListForwardsRequest) (*ListForwardsResponse, error) {
	return call[ListForwardsResponse](ctx, s.c, "ListForwards", req)
}
