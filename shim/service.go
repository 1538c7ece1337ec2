package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/version"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// service is the shim's ttrpc service (its errors travel as their errdefs
// kinds) and the state of the one run it owns.
type service struct {
	rec    *session.Record
	dir    session.Dir
	out    *outputlog.Writer
	cg     cgroupfs.Cgroup
	log    *logrus.Entry
	reaper *reaper

	exited    chan struct{} // closed once the exit is in status.json
	cleanedUp chan struct{} // closed once the run's leftovers are gone
	shutdown  chan struct{} // closed by Shutdown
	stopOnce  sync.Once

	// outFull is closed once the output log has reached its limit, which
	// ends the run.
	outFull     chan struct{}
	outFullOnce sync.Once

	stdinMu sync.Mutex // serializes writes, so two writers never interleave within a write

	// runners are the strategies this shim binary runs.
	runners map[strategy.Name]Runner

	// secrets are the run's bindings inside a boundary, from Start: in
	// memory only.
	secrets []*shimv1.Secret

	// fwd are the run's forwards from the host's loopback into the session.
	fwd forwards

	// warm is the run prepared ahead of its session (session.Record.Warm),
	// until Start binds it or the shim discards it.
	warm Prepared

	renewMu sync.Mutex // guards the fields below
	// renewed are the secrets renewed by their token endpoints during the
	// run, by name: their latest values, for SecretUpdates.
	renewed    map[string]string
	renewGen   uint64
	renewAgain chan struct{} // closed (and replaced) at each renewal

	mu          sync.Mutex // guards the fields below
	status      shimv1.Status
	run         Run // once the runtime runs
	pid         int // the runtime's
	startedAt   time.Time
	stdin       StdinWriter
	stdinClosed bool
	exit        *session.Status
	// pending is a signal that came while the run was starting (a stop
	// racing a start, a VM still booting): the runtime gets it as soon as
	// it runs, the strongest of them (SIGKILL over any other).
	pending syscall.Signal
	// outputLimited: the run was stopped at the output limit.
	outputLimited bool
	outputErr     string // the last output log error logged, so that each is logged once
}

func newService(rec *session.Record, dir session.Dir, out *outputlog.Writer, log *logrus.Entry, runners map[strategy.Name]Runner, r *reaper) *service {
	return &service{
		rec: rec, dir: dir, out: out, log: log, runners: runners,
		cg:         cgroupfs.Cgroup{Dirs: rec.Spec.Cgroup},
		reaper:     r,
		exited:     make(chan struct{}),
		cleanedUp:  make(chan struct{}),
		shutdown:   make(chan struct{}),
		status:     shimv1.Status_CREATED,
		outFull:    make(chan struct{}),
		renewed:    map[string]string{},
		renewAgain: make(chan struct{}),
	}
}

// renew records a secret's value renewed by its token endpoint, by the
// run's placeholder for it.
func (s *service) renew(placeholder, value string) {
	for _, sec := range s.secrets {
		if sec.Placeholder != placeholder || sec.Name == "" {
			continue
		}
		s.renewMu.Lock()
		s.renewed[sec.Name] = value
		s.renewGen++
		close(s.renewAgain)
		s.renewAgain = make(chan struct{})
		s.renewMu.Unlock()
		s.log.WithField("secret", sec.Name).Info("secret renewed by its token endpoint")
	}
}

// SecretUpdates answers with the renewed secrets once there are renewals
// past req.After, the run has ended, or the call's deadline is near.
func (s *service) SecretUpdates(ctx context.Context, req *shimv1.SecretUpdatesRequest) (*shimv1.SecretUpdatesResponse, error) {
	for {
		s.renewMu.Lock()
		gen, again := s.renewGen, s.renewAgain
		s.renewMu.Unlock()
		ended := false
		select {
		case <-s.exited:
			ended = true
		default:
		}
		if gen > req.After || ended {
			return s.renewals(ended), nil
		}
		select {
		case <-again:
		case <-s.exited:
		case <-ctx.Done():
			return s.renewals(false), nil
		}
	}
}

func (s *service) renewals(ended bool) *shimv1.SecretUpdatesResponse {
	s.renewMu.Lock()
	defer s.renewMu.Unlock()
	resp := &shimv1.SecretUpdatesResponse{Generation: s.renewGen, Ended: ended}
	for name, v := range s.renewed {
		resp.Updates = append(resp.Updates, &shimv1.SecretUpdate{Name: name, Value: v})
	}
	return resp
}

func (s *service) Handshake(_ context.Context, req *shimv1.HandshakeRequest) (*shimv1.HandshakeResponse, error) {
	if req.ApiVersion < shimv1.MinAPIVersion {
		return nil, errdefs.FailedPrecondition(
			"shim API version %d is too old for this shim (it speaks %d to %d)", req.ApiVersion, shimv1.MinAPIVersion, shimv1.APIVersion)
	}
	return &shimv1.HandshakeResponse{
		ApiVersion: shimv1.APIVersion, ShimVersion: version.Version,
		SessionId: s.rec.ID, Run: s.rec.Run,
	}, nil
}

func (s *service) Start(_ context.Context, req *shimv1.StartRequest) (*shimv1.StartResponse, error) {
	for i, kv := range req.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			// Named by its position only: the entry may hold a secret.
			return nil, errdefs.InvalidArgument("session %s: start: variable %d of the run's private env is not KEY=VALUE", s.rec.ID, i+1)
		}
	}
	s.mu.Lock()
	if s.status != shimv1.Status_CREATED {
		st := s.status
		s.mu.Unlock()
		return nil, errdefs.FailedPrecondition("session %s: cannot start a run that is %s", s.rec.ID, strings.ToLower(st.String()))
	}
	if s.warm != nil {
		// The supervisor has bound the session to this warm shim: what it
		// sent with Start (or, before API version 6, wrote in
		// session.json) is the session's own.
		if err := s.claimLocked(req.Claim); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	s.status = shimv1.Status_RUNNING // no second Start gets past here
	// In memory only: session.json is not written again by the shim.
	s.rec.Spec.Env = session.MergeEnv(s.rec.Spec.Env, req.Env)
	s.secrets = req.Secrets
	s.mu.Unlock()

	if s.out.Full() {
		err := errdefs.FailedPrecondition("%s: session %s's output.log is full; start a new session", s.outputLimitReason(), s.rec.ID)
		s.finish(session.Exited, -1, err.Error())
		close(s.cleanedUp)
		return nil, err
	}
	run, err := s.launch()
	if err != nil {
		s.log.WithError(err).Error("start runtime")
		// Whatever the start got as far as starting goes before the
		// failure is reported, so that the cgroup can be removed.
		if len(s.cg.Dirs) > 0 {
			if kerr := s.cg.Kill(KillTimeout); kerr != nil {
				s.log.WithError(kerr).Warn("kill what the failed start left")
			}
		}
		s.finish(session.Exited, -1, err.Error())
		close(s.cleanedUp)
		return nil, err
	}
	go func() {
		exit := run.Wait()
		s.closeForwards()
		s.finish(exit.State, exit.Code, exit.Reason)
		// What outlives the reported exit goes after it: no one waits for
		// it, and a session started meanwhile may share it.
		run.Release()
		close(s.cleanedUp)
	}()
	s.mu.Lock()
	pid := s.pid
	s.mu.Unlock()
	return &shimv1.StartResponse{Pid: uint32(pid)}, nil
}

// claimLocked takes what the supervisor bound to a warm shim at claim
// time: the command, the env, the creation time. It comes with Start
// (claim); a supervisor of API version 5 and older wrote it in session.json
// instead (claim nil). The rest of the record is what the warm run was
// prepared from, which the supervisor compared before it claimed the shim.
func (s *service) claimLocked(claim *shimv1.Claim) error {
	if claim == nil {
		rec, err := s.dir.ReadRecord()
		if err != nil {
			return fmt.Errorf("session %s: read the claimed session: %w", s.rec.ID, err)
		}
		if rec.ID != s.rec.ID || rec.Run != s.rec.Run || rec.Warm {
			return errdefs.FailedPrecondition("session %s: session.json does not bind this warm shim (session %s, run %d, warm %v)", s.rec.ID, rec.ID, rec.Run, rec.Warm)
		}
		claim = &shimv1.Claim{Command: rec.Spec.Command, CommandOverride: rec.Spec.CommandOverride, Env: rec.Spec.Env, CreatedAt: rec.CreatedAt}
	}
	if len(claim.Command) == 0 || claim.Command[0] == "" {
		return errdefs.InvalidArgument("session %s: the claim of the warm shim has no command", s.rec.ID)
	}
	s.rec.Warm, s.rec.CreatedAt = false, claim.CreatedAt
	s.rec.Spec.Command, s.rec.Spec.CommandOverride, s.rec.Spec.Env = claim.Command, claim.CommandOverride, claim.Env
	s.log.Info("warm boundary claimed")
	return nil
}

func (s *service) runner() (Runner, error) {
	runner := s.runners[s.rec.Strategy]
	if runner == nil {
		return nil, errdefs.FailedPrecondition("session %s: this shim (%s) does not run the %s strategy: the daemon starts the shim of each strategy's family", s.rec.ID, os.Args[0], s.rec.Strategy)
	}
	return runner, nil
}

// prepareWarm prepares the run of a warm shim (session.Record.Warm), for
// Start to bind.
func (s *service) prepareWarm() error {
	runner, err := s.runner()
	if err != nil {
		return err
	}
	p, ok := runner.(Preparer)
	if !ok {
		return errdefs.FailedPrecondition("session %s: the %s strategy has no warm boundaries", s.rec.ID, s.rec.Strategy)
	}
	prepared, err := p.Prepare(&Host{s})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.warm = prepared
	s.mu.Unlock()
	s.log.Info("warm boundary ready")
	return nil
}

// discardWarm ends a warm run that no session claimed.
func (s *service) discardWarm() {
	s.mu.Lock()
	p := s.warm
	s.warm = nil
	s.mu.Unlock()
	if p != nil {
		p.Discard(&Host{s})
		s.log.Info("warm boundary discarded")
	}
}

// launch starts the runtime with this shim's runner for the session's
// strategy: the warm run when there is one, built afresh when the warm one
// is stale.
func (s *service) launch() (Run, error) {
	s.mu.Lock()
	p := s.warm
	s.warm = nil
	s.mu.Unlock()
	if p != nil {
		run, err := p.Start(&Host{s})
		if !errors.Is(err, ErrStaleBoundary) {
			return run, err
		}
		s.log.WithError(err).Info("warm boundary stale: building it again")
		p.Discard(&Host{s})
	}
	runner, err := s.runner()
	if err != nil {
		return nil, err
	}
	return runner.Start(&Host{s})
}

func (s *service) State(context.Context, *shimv1.StateRequest) (*shimv1.StateResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &shimv1.StateResponse{
		SessionId: s.rec.ID, Run: s.rec.Run, Status: s.status,
		ShimPid: uint32(os.Getpid()), Pid: uint32(s.pid),
		Limits: s.rec.Spec.LimitsNote, StartedAt: s.startedAt,
	}
	if len(s.cg.Dirs) > 0 {
		resp.Cgroup = s.cg.Dirs[0]
	}
	if s.exit != nil {
		resp.ExitCode = int32(s.exit.ExitCode)
		resp.Reason = s.exit.Reason
		resp.ExitedAt = s.exit.ExitedAt
	}
	return resp, nil
}

func (s *service) Kill(_ context.Context, req *shimv1.KillRequest) (*shimv1.KillResponse, error) {
	sig := syscall.Signal(req.Signal)
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	run, starting := s.currentOrStarting(sig)
	if starting {
		s.log.WithField("signal", sig).Info("signal while the run starts: the runtime gets it once it runs")
		return &shimv1.KillResponse{}, nil
	}
	if run == nil {
		return nil, errdefs.FailedPrecondition("session %s is not running", s.rec.ID)
	}
	if err := run.Signal(sig, req.All); err != nil {
		return nil, fmt.Errorf("signal the runtime of session %s: %w", s.rec.ID, err)
	}
	return &shimv1.KillResponse{}, nil
}

// currentOrStarting is the run while its runtime runs. While the run is
// still starting, sig is kept for it (starting is true), to be delivered by
// running.
func (s *service) currentOrStarting(sig syscall.Signal) (run Run, starting bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	run = s.currentLocked()
	if run == nil && s.status == shimv1.Status_RUNNING && s.exit == nil {
		if s.pending != syscall.SIGKILL {
			s.pending = sig
		}
		return nil, true
	}
	return run, false
}

// current is the run while its runtime runs, else nil.
func (s *service) current() Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.currentLocked()
}

func (s *service) currentLocked() Run {
	if s.status != shimv1.Status_RUNNING || s.exit != nil {
		return nil
	}
	return s.run
}

// signalAll signals every process of the session. It reports whether a run
// was there.
func (s *service) signalAll(sig syscall.Signal) bool {
	run := s.current()
	if run == nil {
		return false
	}
	if err := run.Signal(sig, true); err != nil {
		s.log.WithError(err).Warnf("send %v to the session", sig)
	}
	return true
}

func (s *service) Wait(ctx context.Context, _ *shimv1.WaitRequest) (*shimv1.WaitResponse, error) {
	select {
	case <-s.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return &shimv1.WaitResponse{
		ExitCode: int32(s.exit.ExitCode), Reason: s.exit.Reason, ExitedAt: s.exit.ExitedAt,
	}, nil
}

func (s *service) WriteStdin(ctx context.Context, req *shimv1.WriteStdinRequest) (*shimv1.WriteStdinResponse, error) {
	if len(req.Data) > shimv1.MaxStdinWrite {
		return nil, errdefs.InvalidArgument("stdin write of %d bytes is over the %d-byte limit: send it in pieces", len(req.Data), shimv1.MaxStdinWrite)
	}
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	s.mu.Lock()
	f, closed := s.stdin, s.stdinClosed
	s.mu.Unlock()
	if f == nil {
		return nil, errdefs.FailedPrecondition("session %s has not started", s.rec.ID)
	}
	if closed {
		return nil, errdefs.FailedPrecondition("stdin of session %s is closed", s.rec.ID)
	}
	// A runtime that does not read blocks the write; the caller's deadline
	// or cancellation ends it.
	f.SetWriteDeadline(time.Time{})
	if d, ok := ctx.Deadline(); ok {
		f.SetWriteDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(time.Now()) })
	defer stop()
	n, err := f.Write(req.Data)
	// Recorded after the write: a reader of the log sees an answer no
	// earlier than the runtime could have.
	if req.Record && n > 0 {
		s.writeOutput(outputlog.Stdin, req.Data[:n])
	}
	if err != nil {
		switch {
		case errors.Is(err, syscall.EPIPE):
			err = errdefs.FailedPrecondition("the runtime of session %s closed its stdin", s.rec.ID)
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
			err = ctx.Err()
		case errors.Is(err, os.ErrClosed):
			err = errdefs.FailedPrecondition("stdin of session %s is closed", s.rec.ID)
		}
		return &shimv1.WriteStdinResponse{Written: uint32(n)}, err
	}
	return &shimv1.WriteStdinResponse{Written: uint32(n)}, nil
}

func (s *service) CloseStdin(context.Context, *shimv1.CloseStdinRequest) (*shimv1.CloseStdinResponse, error) {
	s.mu.Lock()
	f := s.stdin
	s.stdinClosed = true
	s.mu.Unlock()
	if f != nil {
		f.Close() // a write blocked on it returns
	}
	return &shimv1.CloseStdinResponse{}, nil
}

func (s *service) Stats(context.Context, *shimv1.StatsRequest) (*shimv1.StatsResponse, error) {
	if len(s.cg.Dirs) == 0 {
		return nil, errdefs.FailedPrecondition("session %s has no cgroup: %s", s.rec.ID, s.rec.Spec.LimitsNote)
	}
	st := s.cg.Stats()
	return &shimv1.StatsResponse{MemoryBytes: st.MemoryBytes, Pids: st.Pids, CpuUsageNs: st.CPUUsageNs}, nil
}

func (s *service) Shutdown(context.Context, *shimv1.ShutdownRequest) (*shimv1.ShutdownResponse, error) {
	s.mu.Lock()
	st := s.status
	s.mu.Unlock()
	if st == shimv1.Status_RUNNING {
		return nil, errdefs.FailedPrecondition("session %s is running: stop it first", s.rec.ID)
	}
	s.stopOnce.Do(func() { close(s.shutdown) })
	return &shimv1.ShutdownResponse{}, nil
}
