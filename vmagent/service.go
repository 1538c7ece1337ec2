package vmagent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/rpcstatus"
	"github.com/agentconnect-md/agentconnect/internal/version"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// shutdownGrace is how long Shutdown's answer has to reach the host before
// the VM powers off (the host treats the connection closing as an answer
// too).
const shutdownGrace = 100 * time.Millisecond

// setupState is where the guest's root stands.
type setupState int

const (
	setupNone    setupState = iota // the initramfs; Setup may run
	setupRunning                   // Setup is running
	setupDone                      // the image's root
	setupFailed                    // half-built: nothing more may run
)

func (s setupState) String() string {
	return [...]string{"not set up", "setting up", "set up", "failed setup"}[s]
}

// service implements the vmagent API.
type service struct {
	logf     func(string, ...any)
	procs    *procTable
	streams  *pendingStreams
	paths    setupPaths
	setup    func(setupPaths, setupPlan, func(string, ...any)) error
	trust    func(caPEM string) error // in the root Setup built
	modules  <-chan struct{}          // closed once Setup's drivers are loaded
	powerOff func() error
	// waitStreams bounds Exec's wait for the streams it names (streamWait).
	waitStreams time.Duration

	// mu guards the fields that follow.
	mu         sync.Mutex
	state      setupState
	setupErr   error
	execs      int // Execs begun: Setup and Trust must come before the first
	trusted    bool
	shutdownAt time.Time
}

var _ vmagentv1.VMAgentService = (*service)(nil)

func (s *service) Health(ctx context.Context, req *vmagentv1.HealthRequest) (*vmagentv1.HealthResponse, error) {
	return &vmagentv1.HealthResponse{
		Version:  version.Version,
		Kernel:   kernelRelease(),
		UptimeMs: uint64(uptime().Milliseconds()),
	}, nil
}

func (s *service) Setup(ctx context.Context, req *vmagentv1.SetupRequest) (*vmagentv1.SetupResponse, error) {
	plan, err := checkSetup(req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch {
	case s.state != setupNone:
		s.mu.Unlock()
		return nil, errdefs.FailedPrecondition("setup: the guest is %s already", s.state)
	case s.execs > 0:
		s.mu.Unlock()
		return nil, errdefs.FailedPrecondition("setup: an Exec came first; Setup must come before any")
	}
	s.state = setupRunning
	s.mu.Unlock()

	select {
	case <-s.modules:
	case <-ctx.Done():
		s.mu.Lock()
		s.state = setupNone // nothing was done
		s.mu.Unlock()
		return nil, fmt.Errorf("setup: wait for the drivers to load: %w", ctx.Err())
	}
	err = s.setup(s.paths, plan, s.logf)

	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.state, s.setupErr = setupFailed, err
		return nil, err
	}
	s.state = setupDone
	return &vmagentv1.SetupResponse{}, nil
}

// Trust makes the guest trust the session CA. It comes after Setup, which
// built the root whose trust store it changes, and before the runtime
// starts: a process started earlier could have read the store without it.
func (s *service) Trust(ctx context.Context, req *vmagentv1.TrustRequest) (*vmagentv1.TrustResponse, error) {
	ca, err := checkTrust(req)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state != setupDone:
		return nil, errdefs.FailedPrecondition("trust: the guest is %s; Trust comes after Setup", s.state)
	case s.trusted:
		return nil, errdefs.FailedPrecondition("trust: the guest trusts a session CA already")
	case s.execs > 0:
		return nil, errdefs.FailedPrecondition("trust: an Exec came first; Trust must come before any")
	case !s.shutdownAt.IsZero():
		return nil, errdefs.FailedPrecondition("trust: the guest is shutting down")
	}
	// Held across the change: an Exec waits for it.
	if err := s.trust(ca); err != nil {
		return nil, fmt.Errorf("trust the session CA: %w", err)
	}
	s.trusted = true
	return &vmagentv1.TrustResponse{}, nil
}

func (s *service) Exec(ctx context.Context, req *vmagentv1.ExecRequest) (*vmagentv1.ExecResponse, error) {
	spec, err := checkExec(req.GetId(), req.GetArgs(), req.GetEnv(), req.GetCwd())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	switch s.state {
	case setupRunning:
		s.mu.Unlock()
		return nil, errdefs.FailedPrecondition("exec %s: Setup is still running", spec.id)
	case setupFailed:
		s.mu.Unlock()
		return nil, errdefs.FailedPrecondition("exec %s: the guest failed its setup: %v", spec.id, s.setupErr)
	}
	if !s.shutdownAt.IsZero() {
		s.mu.Unlock()
		return nil, errdefs.FailedPrecondition("exec %s: the guest is shutting down", spec.id)
	}
	s.execs++
	s.mu.Unlock()

	if user := req.GetUser(); user != "" {
		if !userPattern.MatchString(user) || req.GetUid() == 0 {
			return nil, errdefs.InvalidArgument("exec %s: user %q with uid %d: want a name of lower-case letters, digits, '_' and '-' and a uid other than 0", spec.id, user, req.GetUid())
		}
		if spec.cred, err = runtimeUser(s.paths.etc, user, req.GetUid()); err != nil {
			return nil, fmt.Errorf("exec %s: %w", spec.id, err)
		}
	}
	if err := s.procs.reserve(spec.id); err != nil {
		return nil, err
	}
	want := [3]bool{req.GetStdin(), req.GetStdout(), req.GetStderr()}
	conns, err := s.streams.take(ctx, spec.id, want, s.waitStreams)
	if err != nil {
		s.procs.unreserve(spec.id)
		return nil, err
	}
	p := s.procs.start(spec, conns)
	return &vmagentv1.ExecResponse{Pid: uint32(p.pid)}, nil
}

func (s *service) Signal(ctx context.Context, req *vmagentv1.SignalRequest) (*vmagentv1.SignalResponse, error) {
	if req.GetId() != "" {
		if err := checkID(req.GetId()); err != nil {
			return nil, err
		}
	}
	if err := s.procs.signal(req.GetId(), req.GetSignal(), req.GetAll()); err != nil {
		return nil, err
	}
	return &vmagentv1.SignalResponse{}, nil
}

func (s *service) Wait(ctx context.Context, req *vmagentv1.WaitRequest) (*vmagentv1.WaitResponse, error) {
	if err := checkID(req.GetId()); err != nil {
		return nil, err
	}
	code, reason, err := s.procs.wait(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	return &vmagentv1.WaitResponse{ExitCode: code, Reason: reason}, nil
}

// Shutdown syncs the disks, answers, and powers the VM off shortly after.
func (s *service) Shutdown(ctx context.Context, req *vmagentv1.ShutdownRequest) (*vmagentv1.ShutdownResponse, error) {
	s.mu.Lock()
	first := s.shutdownAt.IsZero()
	if first {
		s.shutdownAt = time.Now()
	}
	s.mu.Unlock()
	unix.Sync()
	if first {
		s.logf("shutdown requested: powering off")
		time.AfterFunc(shutdownGrace, func() {
			if err := s.powerOff(); err != nil {
				s.logf("%v", err)
			}
		})
	}
	return &vmagentv1.ShutdownResponse{}, nil
}

func checkID(id string) error {
	if err := vmtransport.CheckID(id); err != nil {
		return errdefs.InvalidArgument("%v", err)
	}
	return nil
}

// errorsToStatus is the one place errors become ttrpc statuses.
func errorsToStatus(ctx context.Context, unmarshal ttrpc.Unmarshaler, _ *ttrpc.UnaryServerInfo, method ttrpc.Method) (any, error) {
	resp, err := method(ctx, unmarshal)
	return resp, rpcstatus.ToStatus(err)
}
