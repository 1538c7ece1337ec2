package shimv1

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/agentconnect-md/agentconnect/api/shim/v1/internal/shimpb"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
)

var (
	started = time.Date(2026, 12, 1, 20, 5, 0, 123456789, time.UTC)
	exited  = time.Date(2026, 12, 1, 23, 59, 59, 999999999, time.UTC)
	epoch   = time.Unix(0, 0).UTC()
)

// pairs are each message of shim.proto with values that reach every field
// (negative, large, empty and non-ASCII ones among them), as this package's
// type and as protoc-gen-go's.
var pairs = []struct {
	ours message
	ref  proto.Message
}{
	{&HandshakeRequest{ApiVersion: 1, SupervisorVersion: "v1.2.3-ü"}, &shimpb.HandshakeRequest{ApiVersion: 1, SupervisorVersion: "v1.2.3-ü"}},
	{&HandshakeResponse{ApiVersion: 4294967295, ShimVersion: "dev", SessionId: "s-1", Run: 7},
		&shimpb.HandshakeResponse{ApiVersion: 4294967295, ShimVersion: "dev", SessionId: "s-1", Run: 7}},
	{&StartRequest{}, &shimpb.StartRequest{}},
	{&StartRequest{Env: []string{"A=1", "", "KEY=välue=x"}}, &shimpb.StartRequest{Env: []string{"A=1", "", "KEY=välue=x"}}},
	{&StartRequest{Secrets: []*Secret{{Placeholder: "p", Value: "v", Hosts: []string{"a.com", "*.b.com:443"}, Headers: []string{"x-api-key"}}, {}}},
		&shimpb.StartRequest{Secrets: []*shimpb.Secret{{Placeholder: "p", Value: "v", Hosts: []string{"a.com", "*.b.com:443"}, Headers: []string{"x-api-key"}}, {}}}},
	{&StartResponse{Pid: 4194304}, &shimpb.StartResponse{Pid: 4194304}},
	{&StateRequest{}, &shimpb.StateRequest{}},
	{&StateResponse{SessionId: "abc", Run: 2, Status: Status_EXITED, ShimPid: 10, Pid: 11, ExitCode: -9,
		Reason: "killed by SIGKILL", StartedAt: started, ExitedAt: exited, Cgroup: "/sys/fs/cgroup/x", Limits: "memory 1 GiB"},
		&shimpb.StateResponse{SessionId: "abc", Run: 2, Status: shimpb.Status_EXITED, ShimPid: 10, Pid: 11, ExitCode: -9,
			Reason: "killed by SIGKILL", StartedAt: timestamppb.New(started), ExitedAt: timestamppb.New(exited),
			Cgroup: "/sys/fs/cgroup/x", Limits: "memory 1 GiB"}},
	{&StateResponse{Status: Status_RUNNING, StartedAt: epoch}, &shimpb.StateResponse{Status: shimpb.Status_RUNNING, StartedAt: timestamppb.New(epoch)}},
	{&StateResponse{Status: Status_CREATED}, &shimpb.StateResponse{Status: shimpb.Status_CREATED}},
	{&KillRequest{Signal: 15, All: true}, &shimpb.KillRequest{Signal: 15, All: true}},
	{&KillResponse{}, &shimpb.KillResponse{}},
	{&WaitRequest{}, &shimpb.WaitRequest{}},
	{&WaitResponse{ExitCode: 137, Reason: "", ExitedAt: time.Unix(-1, 5).UTC()},
		&shimpb.WaitResponse{ExitCode: 137, ExitedAt: timestamppb.New(time.Unix(-1, 5))}},
	{&WriteStdinRequest{Data: []byte("{\"jsonrpc\":\"2.0\"}\n\x00\xff")}, &shimpb.WriteStdinRequest{Data: []byte("{\"jsonrpc\":\"2.0\"}\n\x00\xff")}},
	{&WriteStdinRequest{Data: []byte("{}\n"), Record: true}, &shimpb.WriteStdinRequest{Data: []byte("{}\n"), Record: true}},
	{&WriteStdinResponse{Written: MaxStdinWrite}, &shimpb.WriteStdinResponse{Written: MaxStdinWrite}},
	{&CloseStdinRequest{}, &shimpb.CloseStdinRequest{}},
	{&CloseStdinResponse{}, &shimpb.CloseStdinResponse{}},
	{&StatsRequest{}, &shimpb.StatsRequest{}},
	{&StatsResponse{MemoryBytes: 1 << 40, Pids: 3, CpuUsageNs: 18446744073709551615},
		&shimpb.StatsResponse{MemoryBytes: 1 << 40, Pids: 3, CpuUsageNs: 18446744073709551615}},
	{&ShutdownRequest{}, &shimpb.ShutdownRequest{}},
	{&ShutdownResponse{}, &shimpb.ShutdownResponse{}},
	{&StartRequest{Secrets: []*Secret{{Placeholder: "p", Value: "v", Name: "claude-refresh", TokenHosts: []string{"platform.claude.com"}, TokenField: "refresh_token"}}},
		&shimpb.StartRequest{Secrets: []*shimpb.Secret{{Placeholder: "p", Value: "v", Name: "claude-refresh", TokenHosts: []string{"platform.claude.com"}, TokenField: "refresh_token"}}}},
	{&StartRequest{Claim: &Claim{Command: []string{"/bin/echo", "x"}, CommandOverride: true, Env: []string{"A=1"}, CreatedAt: started}},
		&shimpb.StartRequest{Claim: &shimpb.Claim{Command: []string{"/bin/echo", "x"}, CommandOverride: true, Env: []string{"A=1"}, CreatedAt: timestamppb.New(started)}}},
	{&StartRequest{Env: []string{"K=v"}, Claim: &Claim{}}, &shimpb.StartRequest{Env: []string{"K=v"}, Claim: &shimpb.Claim{}}},
	{&SecretUpdatesRequest{After: 18446744073709551615}, &shimpb.SecretUpdatesRequest{After: 18446744073709551615}},
	{&SecretUpdatesResponse{}, &shimpb.SecretUpdatesResponse{}},
	{&SecretUpdatesResponse{Generation: 3, Updates: []*SecretUpdate{{Name: "a", Value: "ü"}, {}}, Ended: true},
		&shimpb.SecretUpdatesResponse{Generation: 3, Updates: []*shimpb.SecretUpdate{{Name: "a", Value: "ü"}, {}}, Ended: true}},
	{&ForwardRequest{HostPort: 65535, Port: 1, Detach: true}, &shimpb.ForwardRequest{HostPort: 65535, Port: 1, Detach: true}},
	{&ForwardResponse{}, &shimpb.ForwardResponse{}},
	{&ForwardResponse{Forward: &Forward{}}, &shimpb.ForwardResponse{Forward: &shimpb.Forward{}}},
	{&ForwardResponse{Forward: &Forward{Address: "127.0.0.1:8080", HostPort: 8080, Port: 3000, Detached: true, Connections: 1 << 40}},
		&shimpb.ForwardResponse{Forward: &shimpb.Forward{Address: "127.0.0.1:8080", HostPort: 8080, Port: 3000, Detached: true, Connections: 1 << 40}}},
	{&UnforwardRequest{Address: "127.0.0.1:8080"}, &shimpb.UnforwardRequest{Address: "127.0.0.1:8080"}},
	{&UnforwardResponse{Closed: 4}, &shimpb.UnforwardResponse{Closed: 4}},
	{&ListForwardsRequest{}, &shimpb.ListForwardsRequest{}},
	{&ListForwardsResponse{Forwards: []*Forward{{Address: "a", Port: 1}, {}}}, &shimpb.ListForwardsResponse{Forwards: []*shimpb.Forward{{Address: "a", Port: 1}, {}}}},
}

// TestEncodingIsProtobufs: every message encodes to the bytes protobuf's
// own code writes, and reads back from them, so either side may be the
// previous release's, which used that code.
func TestEncodingIsProtobufs(t *testing.T) {
	for _, p := range pairs {
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(p.ref)
		if err != nil {
			t.Fatal(err)
		}
		if got := marshal(p.ours); !bytes.Equal(got, want) {
			t.Errorf("%T %+v encodes to\n%x\nprotobuf writes\n%x", p.ours, p.ours, got, want)
		}
		back := reflect.New(reflect.TypeOf(p.ours).Elem()).Interface().(message)
		if err := unmarshal(want, back); err != nil {
			t.Errorf("%T: reading protobuf's encoding: %v", p.ours, err)
		} else if !reflect.DeepEqual(back, p.ours) {
			t.Errorf("%T: read %+v from protobuf's encoding, want %+v", p.ours, back, p.ours)
		}
	}
}

// TestUnknownAndBadInput: fields a later release adds are skipped, a field
// of an unexpected wire type too; truncated input is an error.
func TestUnknownAndBadInput(t *testing.T) {
	data, _ := proto.Marshal(&shimpb.StateResponse{SessionId: "abc", Pid: 5, ExitedAt: timestamppb.New(exited)})
	data = protowire.AppendTag(data, 99, protowire.BytesType)
	data = protowire.AppendString(data, "from a later release")
	data = protowire.AppendTag(data, 100, protowire.Fixed64Type)
	data = protowire.AppendFixed64(data, 1)
	data = protowire.AppendTag(data, 5, protowire.BytesType) // Pid, as bytes
	data = protowire.AppendString(data, "x")
	var got StateResponse
	if err := unmarshal(data, &got); err != nil {
		t.Fatalf("unknown fields: %v", err)
	}
	if want := (StateResponse{SessionId: "abc", Pid: 5, ExitedAt: exited}); !reflect.DeepEqual(got, want) {
		t.Errorf("read %+v, want %+v", got, want)
	}
	for _, bad := range [][]byte{data[:len(data)-1], {0x0a, 0x05, 'a'}, {0xff}, {0x4a, 0x02, 0x08}} {
		var m StateResponse
		if err := unmarshal(bad, &m); err == nil {
			t.Errorf("%x read as %+v, want an error", bad, m)
		}
	}
}

// fakeShim answers every call of the reference service with fixed values,
// and State with an error of a kind, as a previous release's shim would.
type fakeShim struct{}

func (fakeShim) Handshake(_ context.Context, r *shimpb.HandshakeRequest) (*shimpb.HandshakeResponse, error) {
	return &shimpb.HandshakeResponse{ApiVersion: r.ApiVersion, ShimVersion: "old", SessionId: r.SupervisorVersion, Run: 3}, nil
}
func (fakeShim) Start(context.Context, *shimpb.StartRequest) (*shimpb.StartResponse, error) {
	return &shimpb.StartResponse{Pid: 42}, nil
}
func (fakeShim) State(context.Context, *shimpb.StateRequest) (*shimpb.StateResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "session abc is not running")
}
func (fakeShim) Kill(context.Context, *shimpb.KillRequest) (*shimpb.KillResponse, error) {
	return &shimpb.KillResponse{}, nil
}
func (fakeShim) Wait(ctx context.Context, _ *shimpb.WaitRequest) (*shimpb.WaitResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, status.Error(codes.InvalidArgument, "no deadline came with the call")
	}
	return &shimpb.WaitResponse{ExitCode: -1, Reason: "lost", ExitedAt: timestamppb.New(exited)}, nil
}
func (fakeShim) WriteStdin(_ context.Context, r *shimpb.WriteStdinRequest) (*shimpb.WriteStdinResponse, error) {
	return &shimpb.WriteStdinResponse{Written: uint32(len(r.Data))}, nil
}
func (fakeShim) CloseStdin(context.Context, *shimpb.CloseStdinRequest) (*shimpb.CloseStdinResponse, error) {
	return &shimpb.CloseStdinResponse{}, nil
}
func (fakeShim) Stats(context.Context, *shimpb.StatsRequest) (*shimpb.StatsResponse, error) {
	return &shimpb.StatsResponse{MemoryBytes: 1 << 30, Pids: 2, CpuUsageNs: 5}, nil
}
func (fakeShim) Shutdown(context.Context, *shimpb.ShutdownRequest) (*shimpb.ShutdownResponse, error) {
	return &shimpb.ShutdownResponse{}, nil
}
func (fakeShim) SecretUpdates(_ context.Context, r *shimpb.SecretUpdatesRequest) (*shimpb.SecretUpdatesResponse, error) {
	return &shimpb.SecretUpdatesResponse{Generation: r.After + 1, Updates: []*shimpb.SecretUpdate{{Name: "n", Value: "v"}}}, nil
}

func (fakeShim) Forward(_ context.Context, r *shimpb.ForwardRequest) (*shimpb.ForwardResponse, error) {
	return &shimpb.ForwardResponse{Forward: &shimpb.Forward{Address: "127.0.0.1:40001", HostPort: 40001, Port: r.Port, Detached: r.Detach}}, nil
}

func (fakeShim) Unforward(_ context.Context, r *shimpb.UnforwardRequest) (*shimpb.UnforwardResponse, error) {
	return &shimpb.UnforwardResponse{Closed: 1}, nil
}

func (fakeShim) ListForwards(context.Context, *shimpb.ListForwardsRequest) (*shimpb.ListForwardsResponse, error) {
	return &shimpb.ListForwardsResponse{Forwards: []*shimpb.Forward{{Address: "127.0.0.1:40001", HostPort: 40001, Port: 8080, Connections: 3}}}, nil
}

func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "shim.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	return l, sock
}

// TestClientOfLibraryServer: this package's client calls a shim served by
// the ttrpc library with protobuf's code, as a supervisor adopting the
// previous release's shim does.
func TestClientOfLibraryServer(t *testing.T) {
	l, sock := listen(t)
	srv, err := ttrpc.NewServer(ttrpc.WithServerHandshaker(ttrpc.UnixSocketRequireSameUser()))
	if err != nil {
		t.Fatal(err)
	}
	shimpb.RegisterShimService(srv, fakeShim{})
	go srv.Serve(context.Background(), l)
	defer srv.Close()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpclite.NewClient(conn)
	defer c.Close()
	shim := NewShimClient(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	hs, err := shim.Handshake(ctx, &HandshakeRequest{ApiVersion: APIVersion, SupervisorVersion: "new"})
	if err != nil || *hs != (HandshakeResponse{ApiVersion: APIVersion, ShimVersion: "old", SessionId: "new", Run: 3}) {
		t.Errorf("Handshake: %+v, %v", hs, err)
	}
	if st, err := shim.Start(ctx, &StartRequest{}); err != nil || st.Pid != 42 {
		t.Errorf("Start: %+v, %v", st, err)
	}
	if _, err := shim.State(ctx, &StateRequest{}); !errors.Is(err, errdefs.ErrFailedPrecondition) || err.Error() != "session abc is not running" {
		t.Errorf("State: %v, want FailedPrecondition with the shim's text", err)
	}
	if w, err := shim.Wait(ctx, &WaitRequest{}); err != nil || !reflect.DeepEqual(*w, WaitResponse{ExitCode: -1, Reason: "lost", ExitedAt: exited}) {
		t.Errorf("Wait (the deadline must reach the shim): %+v, %v", w, err)
	}
	data := bytes.Repeat([]byte("x"), MaxStdinWrite)
	if w, err := shim.WriteStdin(ctx, &WriteStdinRequest{Data: data}); err != nil || w.Written != MaxStdinWrite {
		t.Errorf("WriteStdin of MaxStdinWrite bytes: %+v, %v", w, err)
	}
	if s, err := shim.Stats(ctx, &StatsRequest{}); err != nil || *s != (StatsResponse{MemoryBytes: 1 << 30, Pids: 2, CpuUsageNs: 5}) {
		t.Errorf("Stats: %+v, %v", s, err)
	}
	if u, err := shim.SecretUpdates(ctx, &SecretUpdatesRequest{After: 4}); err != nil || u.Generation != 5 || len(u.Updates) != 1 || *u.Updates[0] != (SecretUpdate{Name: "n", Value: "v"}) {
		t.Errorf("SecretUpdates: %+v, %v", u, err)
	}
	if f, err := shim.Forward(ctx, &ForwardRequest{Port: 8080, Detach: true}); err != nil || f.Forward == nil || *f.Forward != (Forward{Address: "127.0.0.1:40001", HostPort: 40001, Port: 8080, Detached: true}) {
		t.Errorf("Forward: %+v, %v", f, err)
	}
	if u, err := shim.Unforward(ctx, &UnforwardRequest{Address: "127.0.0.1:40001"}); err != nil || u.Closed != 1 {
		t.Errorf("Unforward: %+v, %v", u, err)
	}
	if l, err := shim.ListForwards(ctx, &ListForwardsRequest{}); err != nil || len(l.Forwards) != 1 || l.Forwards[0].Connections != 3 {
		t.Errorf("ListForwards: %+v, %v", l, err)
	}
	for name, call := range map[string]func() error{
		"Kill":       func() error { _, err := shim.Kill(ctx, &KillRequest{Signal: 9, All: true}); return err },
		"CloseStdin": func() error { _, err := shim.CloseStdin(ctx, &CloseStdinRequest{}); return err },
		"Shutdown":   func() error { _, err := shim.Shutdown(ctx, &ShutdownRequest{}); return err },
	} {
		if err := call(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	srv.Close()
	// The library's Close ends its connections in the background: a call
	// just after it may still be answered. Once the connection is gone,
	// every call is ErrClosed.
	var err2 error
	for i := 0; i < 200 && err2 == nil; i++ {
		if _, err2 = shim.Stats(ctx, &StatsRequest{}); err2 == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !errors.Is(err2, ttrpclite.ErrClosed) {
		t.Errorf("a call to a closed shim: %v, want ErrClosed", err2)
	}
}

// ourShim serves this package's API with fixed values (the calls the test
// makes).
type ourShim struct{ ShimService }

func (ourShim) Handshake(_ context.Context, r *HandshakeRequest) (*HandshakeResponse, error) {
	return &HandshakeResponse{ApiVersion: r.ApiVersion, ShimVersion: "this", Run: 1}, nil
}
func (ourShim) State(ctx context.Context, _ *StateRequest) (*StateResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, errdefs.InvalidArgument("no deadline came with the call")
	}
	return &StateResponse{SessionId: "abc", Status: Status_RUNNING, Pid: 9, StartedAt: started}, nil
}
func (ourShim) Kill(context.Context, *KillRequest) (*KillResponse, error) {
	return nil, errdefs.FailedPrecondition("session abc is not running")
}

// TestServerForLibraryClient: the ttrpc library's client, with protobuf's
// code, calls a shim served by this package.
func TestServerForLibraryClient(t *testing.T) {
	l, sock := listen(t)
	srv := ttrpclite.NewServer(true)
	RegisterShimService(srv, ourShim{})
	go srv.Serve(l)
	defer srv.Close()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := ttrpc.NewClient(conn)
	defer c.Close()
	shim := shimpb.NewShimClient(c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	hs, err := shim.Handshake(ctx, &shimpb.HandshakeRequest{ApiVersion: 1})
	if err != nil || hs.ApiVersion != 1 || hs.ShimVersion != "this" || hs.Run != 1 {
		t.Errorf("Handshake: %v, %v", hs, err)
	}
	st, err := shim.State(ctx, &shimpb.StateRequest{})
	if err != nil || st.SessionId != "abc" || st.Status != shimpb.Status_RUNNING || st.Pid != 9 ||
		!st.StartedAt.AsTime().Equal(started) || st.ExitedAt != nil {
		t.Errorf("State (the deadline must reach the shim): %v, %v", st, err)
	}
	if _, err := shim.Kill(ctx, &shimpb.KillRequest{Signal: 9}); status.Code(err) != codes.FailedPrecondition ||
		status.Convert(err).Message() != "session abc is not running" {
		t.Errorf("Kill: %v, want FailedPrecondition with the shim's text", err)
	}
	var resp shimpb.StatsResponse
	if err := c.Call(ctx, ServiceName, "Nope", &shimpb.StatsRequest{}, &resp); status.Code(err) != codes.Unimplemented {
		t.Errorf("an unknown method: %v, want Unimplemented", err)
	}
}
