package shimv1

import "time"

// The messages of the Shim service, as in shim.proto (field numbers and
// all); codec.go encodes them. The names are those protoc-gen-go gives,
// except that a google.protobuf.Timestamp is a time.Time here.

// HandshakeRequest is the first call on a connection: the API version the supervisor speaks.
type HandshakeRequest struct {
	ApiVersion        uint32
	SupervisorVersion string
}

func (m *HandshakeRequest) fields() []field {
	return []field{uint32Field(1, &m.ApiVersion), stringField(2, &m.SupervisorVersion)}
}

// HandshakeResponse names the shim's API version and the run it serves.
type HandshakeResponse struct {
	ApiVersion  uint32
	ShimVersion string
	SessionId   string
	Run         uint32
}

func (m *HandshakeResponse) fields() []field {
	return []field{uint32Field(1, &m.ApiVersion), stringField(2, &m.ShimVersion), stringField(3, &m.SessionId), uint32Field(4, &m.Run)}
}

// StartRequest asks the shim to run the session's runtime, once.
type StartRequest struct {
	// Env is set over the session's env for this run only: the shim keeps
	// it in memory and writes it nowhere (the values of secrets on host).
	Env []string
	// Secrets are the run's bindings inside a boundary: the shim's proxy
	// swaps each placeholder for its value toward the secret's hosts. Kept
	// in memory only, like Env.
	Secrets []*Secret
	// Claim is what a session binds to the warm shim it claimed; nil for
	// a cold run. A shim of an older API reads it from session.json.
	Claim *Claim
}

func (m *StartRequest) fields() []field {
	return []field{repeatedStringField(1, &m.Env), repeatedMessageField(2, &m.Secrets), messageField(3, &m.Claim)}
}

// Claim is what is a session's own in a warm shim's run (session.Spec's
// Command, CommandOverride and Env, and the record's CreatedAt): the rest
// of its record is what the warm run was prepared from.
type Claim struct {
	Command         []string
	CommandOverride bool
	Env             []string
	CreatedAt       time.Time
}

func (m *Claim) fields() []field {
	return []field{repeatedStringField(1, &m.Command), boolField(2, &m.CommandOverride), repeatedStringField(3, &m.Env), timeField(4, &m.CreatedAt)}
}

// Secret is one binding of a run inside a boundary.
type Secret struct {
	Placeholder string
	Value       string
	Hosts       []string // network policy entries
	Headers     []string // lower case; none: any
	Name        string   // the secret's, in the store
	// TokenHosts renew the value (an OAuth token endpoint), from the field
	// TokenField of their answers; see SecretUpdates.
	TokenHosts []string
	TokenField string
}

func (m *Secret) fields() []field {
	return []field{stringField(1, &m.Placeholder), stringField(2, &m.Value), repeatedStringField(3, &m.Hosts), repeatedStringField(4, &m.Headers),
		stringField(5, &m.Name), repeatedStringField(6, &m.TokenHosts), stringField(7, &m.TokenField)}
}

// StartResponse is the runtime's pid.
type StartResponse struct {
	Pid uint32
}

func (m *StartResponse) fields() []field { return []field{uint32Field(1, &m.Pid)} }

// StateRequest asks for the run's state.
type StateRequest struct{}

func (*StateRequest) fields() []field { return nil }

// StateResponse is the run: the runtime's pid while it runs, its exit after.
type StateResponse struct {
	SessionId string
	Run       uint32
	Status    Status
	ShimPid   uint32
	Pid       uint32 // the runtime's
	ExitCode  int32
	Reason    string
	StartedAt time.Time
	ExitedAt  time.Time
	Cgroup    string // the session's cgroup path, empty when unlimited
	Limits    string // what limits apply, or why none do
}

func (m *StateResponse) fields() []field {
	return []field{
		stringField(1, &m.SessionId), uint32Field(2, &m.Run), statusField(3, &m.Status),
		uint32Field(4, &m.ShimPid), uint32Field(5, &m.Pid), int32Field(6, &m.ExitCode),
		stringField(7, &m.Reason), timeField(8, &m.StartedAt), timeField(9, &m.ExitedAt),
		stringField(10, &m.Cgroup), stringField(11, &m.Limits),
	}
}

// KillRequest signals the runtime, or with All every process of the session.
type KillRequest struct {
	Signal uint32
	All    bool
}

func (m *KillRequest) fields() []field {
	return []field{uint32Field(1, &m.Signal), boolField(2, &m.All)}
}

// KillResponse says the signal was sent.
type KillResponse struct{}

func (*KillResponse) fields() []field { return nil }

// WaitRequest waits for the runtime's exit to be recorded.
type WaitRequest struct{}

func (*WaitRequest) fields() []field { return nil }

// WaitResponse is the recorded exit.
type WaitResponse struct {
	ExitCode int32
	Reason   string
	ExitedAt time.Time
}

func (m *WaitResponse) fields() []field {
	return []field{int32Field(1, &m.ExitCode), stringField(2, &m.Reason), timeField(3, &m.ExitedAt)}
}

// WriteStdinRequest is input for the runtime's stdin, MaxStdinWrite bytes at most.
type WriteStdinRequest struct {
	Data []byte
	// Record appends what was written to the output log as stdin records.
	Record bool
}

func (m *WriteStdinRequest) fields() []field {
	return []field{dataField(1, &m.Data), boolField(2, &m.Record)}
}

// WriteStdinResponse says how much of it was written.
type WriteStdinResponse struct {
	Written uint32
}

func (m *WriteStdinResponse) fields() []field { return []field{uint32Field(1, &m.Written)} }

// CloseStdinRequest closes the runtime's stdin: it reads EOF.
type CloseStdinRequest struct{}

func (*CloseStdinRequest) fields() []field { return nil }

// CloseStdinResponse says stdin is closed.
type CloseStdinResponse struct{}

func (*CloseStdinResponse) fields() []field { return nil }

// StatsRequest asks for the session's cgroup counters.
type StatsRequest struct{}

func (*StatsRequest) fields() []field { return nil }

// StatsResponse is the session's cgroup counters.
type StatsResponse struct {
	MemoryBytes uint64
	Pids        uint64
	CpuUsageNs  uint64
}

func (m *StatsResponse) fields() []field {
	return []field{uint64Field(1, &m.MemoryBytes), uint64Field(2, &m.Pids), uint64Field(3, &m.CpuUsageNs)}
}

// ShutdownRequest makes a shim whose run has ended exit now.
type ShutdownRequest struct{}

func (*ShutdownRequest) fields() []field { return nil }

// ShutdownResponse says the shim exits.
type ShutdownResponse struct{}

func (*ShutdownResponse) fields() []field { return nil }

// SecretUpdatesRequest waits for renewals past generation After.
type SecretUpdatesRequest struct {
	After uint64
}

func (m *SecretUpdatesRequest) fields() []field { return []field{uint64Field(1, &m.After)} }

// SecretUpdatesResponse is every renewed secret's latest value, at
// Generation; Ended: the run has ended, and no more will come.
type SecretUpdatesResponse struct {
	Generation uint64
	Updates    []*SecretUpdate
	Ended      bool
}

func (m *SecretUpdatesResponse) fields() []field {
	return []field{uint64Field(1, &m.Generation), repeatedMessageField(2, &m.Updates), boolField(3, &m.Ended)}
}

// SecretUpdate is a renewed secret's value.
type SecretUpdate struct {
	Name  string
	Value string
}

func (m *SecretUpdate) fields() []field {
	return []field{stringField(1, &m.Name), stringField(2, &m.Value)}
}

// ForwardRequest opens a listener on the host's loopback (HostPort, or any
// free port when 0) whose connections reach Port inside the session. A
// forward not Detach-ed lasts as long as the connection that asked for it
// (the supervisor's): it closes with it. API 5.
type ForwardRequest struct {
	HostPort uint32
	Port     uint32
	Detach   bool
}

func (m *ForwardRequest) fields() []field {
	return []field{uint32Field(1, &m.HostPort), uint32Field(2, &m.Port), boolField(3, &m.Detach)}
}

// Forward is one forward of a run.
type Forward struct {
	Address     string // host:port on the host's loopback
	HostPort    uint32
	Port        uint32 // inside
	Detached    bool
	Connections uint64 // accepted so far
}

func (m *Forward) fields() []field {
	return []field{stringField(1, &m.Address), uint32Field(2, &m.HostPort), uint32Field(3, &m.Port), boolField(4, &m.Detached), uint64Field(5, &m.Connections)}
}

// ForwardResponse is the forward opened.
type ForwardResponse struct {
	Forward *Forward
}

func (m *ForwardResponse) fields() []field { return []field{messageField(1, &m.Forward)} }

// UnforwardRequest closes the forward at Address.
type UnforwardRequest struct {
	Address string
}

func (m *UnforwardRequest) fields() []field { return []field{stringField(1, &m.Address)} }

// UnforwardResponse says how many forwards were closed.
type UnforwardResponse struct {
	Closed uint32
}

func (m *UnforwardResponse) fields() []field { return []field{uint32Field(1, &m.Closed)} }

// ListForwardsRequest asks for the run's forwards.
type ListForwardsRequest struct{}

func (*ListForwardsRequest) fields() []field { return nil }

// ListForwardsResponse lists the run's forwards.
type ListForwardsResponse struct {
	Forwards []*Forward
}

func (m *ListForwardsResponse) fields() []field { return []field{repeatedMessageField(1, &m.Forwards)} }
