// Package supervisor is the agentconnect daemon: the admin API, the agent
// store, the strategy probes, and the sessions it runs through one shim
// each. It can be killed or restarted at any moment: the sessions live in
// their shims, and the next supervisor adopts them.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/hostuser"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/limits"
	"github.com/agentconnect-md/agentconnect/supervisor/probe"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
	"github.com/agentconnect-md/agentconnect/supervisor/secret"
)

// Options configure a supervisor. Home and ShimBinary are required.
type Options struct {
	Home string
	// ConfigPath is --config; empty means <home>/config.json, which may be
	// missing.
	ConfigPath     string
	RequireSandbox bool
	// ShimBinary runs host and srt sessions (agentconnect-shim),
	// VMShimBinary microsandbox sessions and its check
	// (agentconnect-shim-vm), VMImageBinary its guest images
	// (agentconnect-vmimage); without either microsandbox is unavailable.
	ShimBinary    string
	VMShimBinary  string
	VMImageBinary string
	// ImageDir holds the default microsandbox image.
	ImageDir string
	// Listener is the admin socket when it was handed over (systemd socket
	// activation, or a re-exec); nil makes the supervisor create it.
	Listener net.Listener
	// Lock is the home lock (home.Layout.Lock), held by the caller so that
	// a re-exec can hand it over.
	Lock *os.File
	// Args is the daemon's command line, reported by status.
	Args []string
	Log  *logrus.Logger
	// Ready is called once the admin socket serves, after recovery.
	Ready func()
	// StartTimeout bounds a shim's Start call; zero is the default, longer
	// than the shim's own bound. Tests shorten it to make starts time out.
	StartTimeout time.Duration
}

// Supervisor is a running daemon.
type Supervisor struct {
	opts      Options
	layout    home.Layout
	cfg       *config.Config
	probes    []probe.Result
	cgroups   *limits.Manager // nil when sessions run without cgroups
	cgSupport limits.Support
	socketDir string
	store     agent.Store
	secrets   *secret.Store
	runtimes  *runtimes.Cache
	// hostUser is the account host sessions run as (sandbox.host.user);
	// nil: the daemon's own.
	hostUser  *session.RunAs
	events    *eventLog
	log       *logrus.Logger
	startedAt time.Time
	// ctx ends when the supervisor stops; the goroutines that watch shims
	// use it and leave the shims alone.
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex               // guards agents, sessions and starting
	agents   map[string]*agent.Agent  // by id
	sessions map[string]*sessionState // by id
	// starting counts, by agent id, the runs being started (a new
	// session, or a resume): an agent is not removed while one is.
	starting map[string]int

	images imageAnswers // the guest image the VM starts use
	warm   *warmPool    // the agents' warm boundaries
	spares *sparePool   // a spare shim per shim binary, for cold starts
	gate   *startGate   // the cold starts in flight, per strategy
}

// ErrRestart is the cause to cancel Run's context with to restart the
// daemon: Run then hands over its admin socket instead of removing it.
var ErrRestart = errors.New("restart requested")

// Handover is what a restarting supervisor passes to the next process: its
// admin socket, so that no client is refused in between.
type Handover struct {
	Listener *os.File
}

// Run starts the supervisor, serves the admin API until ctx ends, and then
// stops, leaving every session running. A supervisor that cannot start
// records why in the home, for `status` to show. When ctx was cancelled
// with ErrRestart, Run returns the Handover for the next process.
func Run(ctx context.Context, opts Options) (*Handover, error) {
	s, err := newSupervisor(opts)
	if err != nil {
		recordStartupFailure(home.Layout{Root: opts.Home}, err)
		return nil, err
	}
	defer s.close()
	return s.serve(ctx)
}

func newSupervisor(opts Options) (_ *Supervisor, retErr error) {
	log := opts.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	s := &Supervisor{
		opts:      opts,
		layout:    home.Layout{Root: opts.Home},
		log:       log,
		events:    newEventLog(),
		startedAt: time.Now(),
		agents:    map[string]*agent.Agent{},
		sessions:  map[string]*sessionState{},
		starting:  map[string]int{},
		warm:      newWarmPool(),
		gate:      newStartGate(),
	}
	s.spares = newSparePool(log, func() bool { return s.gate.quiet(strategy.SRT, spareQuiet) })
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer func() {
		if retErr != nil {
			s.close()
		}
	}()
	if err := s.layout.Create(); err != nil {
		return nil, err
	}
	if opts.Lock == nil {
		return nil, errors.New("supervisor: the home lock is not held")
	}
	if err := s.loadConfig(); err != nil {
		return nil, err
	}
	// The probes run while the sessions are recovered: adopting a shim needs
	// no probe, and a restart with sessions alive should not wait for QEMU's.
	probed := make(chan []probe.Result, 1)
	go func() {
		probed <- probe.Run(s.cfg, probe.Env{ImageDir: opts.ImageDir, VMShimBinary: opts.VMShimBinary, VMImageBinary: opts.VMImageBinary, Home: opts.Home})
	}()
	s.cgroups, s.cgSupport = limits.Setup(home.Layout{Root: opts.Home}.CgroupName())
	if !s.cgSupport.Available {
		log.Warnf("sessions run without cgroup limits: %s", s.cgSupport.Reason)
	}
	dir, err := s.layout.SocketDir()
	if err != nil {
		return nil, err
	}
	s.socketDir = dir
	s.store = agent.Store{Dir: s.layout.AgentsDir()}
	if s.secrets, err = secret.Open(s.layout.SecretsPath()); err != nil {
		return nil, err
	}
	s.runtimes = runtimes.Open(s.layout.RuntimesDir())
	if err := s.loadAgents(); err != nil {
		return nil, err
	}
	s.recoverSessions()
	s.probes = <-probed
	for _, r := range s.probes {
		if r.Available {
			log.WithField("strategy", r.Name).Info("strategy available")
		} else {
			log.WithField("strategy", r.Name).Warnf("strategy unavailable: %s", r.Reason)
		}
	}
	if !probe.AnyAvailable(s.probes) {
		return nil, noStrategyError(s.probes)
	}
	if err := s.setupHostUser(); err != nil {
		return nil, err
	}
	return s, nil
}

// setupHostUser resolves sandbox.host.user when host sessions are to run
// as it (a root daemon, another account), and lets it through the home to
// its agents' directories and the runtime cache: the search bit only.
func (s *Supervisor) setupHostUser() error {
	name := s.cfg.Host.User
	if name == "" || !s.strategyResult(strategy.Host).Available {
		return nil
	}
	u, err := hostuser.Lookup(name)
	if err != nil {
		return err
	}
	if int(u.UID) == os.Geteuid() {
		return nil
	}
	if err := hostuser.OpenPath(s.layout.Root, s.layout.AgentsDir()); err != nil {
		return fmt.Errorf("sandbox.host.user %s: %w", name, err)
	}
	if err := s.runtimes.OpenTrees(); err != nil {
		return fmt.Errorf("sandbox.host.user %s: the runtime cache: %w", name, err)
	}
	s.hostUser = u
	s.log.WithFields(logrus.Fields{"user": name, "uid": u.UID}).Info("host sessions run as sandbox.host.user")
	return nil
}

func (s *Supervisor) loadConfig() error {
	path, explicit := s.opts.ConfigPath, true
	if path == "" {
		path, explicit = s.layout.ConfigPath(), false
	}
	cfg, err := config.Load(path, explicit)
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings {
		s.log.Warn(w)
	}
	if s.opts.RequireSandbox {
		cfg.RequireSandbox("--require-sandbox turns host off on this daemon")
	}
	if lvl, err := logrus.ParseLevel(cfg.LogLevel); err == nil {
		s.log.SetLevel(lvl)
	}
	s.cfg = cfg
	return nil
}

// noStrategyError lists every strategy's reason.
func noStrategyError(results []probe.Result) error {
	var b strings.Builder
	b.WriteString("no execution strategy is available on this daemon, so it does not start:")
	for _, r := range results {
		fmt.Fprintf(&b, "\n  %s: %s", r.Name, r.Reason)
	}
	return errors.New(b.String())
}

func (s *Supervisor) serve(ctx context.Context) (*Handover, error) {
	l := s.opts.Listener
	if l == nil {
		var err error
		if l, err = s.listen(); err != nil {
			recordStartupFailure(s.layout, err)
			return nil, err
		}
	}
	// A copy of the socket, taken now: shutting the server down closes l.
	lf, err := l.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	// Only the daemon's user, root and socketGroup's members get through.
	guarded, stopRefusals, err := s.guard(ctx, l)
	if err != nil {
		lf.Close()
		return nil, err
	}
	defer stopRefusals()
	srv, err := ttrpc.NewServer()
	if err != nil {
		lf.Close()
		return nil, err
	}
	adminv1.RegisterAdminService(srv, &adminService{s: s})
	if err := s.layout.RecordAdminSocket(l.Addr().String()); err != nil {
		s.log.WithError(err).Warn("record the admin socket's path")
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx, guarded) }()
	os.Remove(s.layout.StartupFailurePath())
	for _, r := range s.probes {
		if r.Available {
			s.fillSpare(r.Name)
		}
	}
	for _, a := range s.listAgents() {
		if warmable(a) {
			s.fillWarm(a.ID)
		}
	}
	s.events.add(event{Type: "daemon.started", Message: fmt.Sprintf("pid %d", os.Getpid())})
	s.log.WithFields(logrus.Fields{"home": s.opts.Home, "socket": l.Addr().String(), "pid": os.Getpid()}).Info("daemon serving")
	if s.opts.Ready != nil {
		s.opts.Ready()
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			serveErr = fmt.Errorf("serve admin API: %w", err)
		}
	}
	// Sessions keep running: only the API and the shim connections close.
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(shutdownCtx)
	srv.Close()
	if serveErr == nil && errors.Is(context.Cause(ctx), ErrRestart) {
		s.log.Info("daemon restarting; sessions keep running in their shims")
		return &Handover{Listener: lf}, nil
	}
	lf.Close()
	if s.opts.Listener == nil {
		os.Remove(l.Addr().String())
	}
	s.log.Info("daemon stopped; sessions keep running in their shims")
	return nil, serveErr
}

// close releases what the supervisor holds; the sessions stay.
func (s *Supervisor) close() {
	s.cancel()
	s.closeWarm()
	s.spares.close()
	s.mu.Lock()
	for _, ss := range s.sessions {
		ss.detach()
	}
	s.mu.Unlock()
	if s.cgroups != nil {
		s.cgroups.Close()
	}
}

// strategyResult returns the probe result of n.
func (s *Supervisor) strategyResult(n strategy.Name) probe.Result {
	for _, r := range s.probes {
		if r.Name == n {
			return r
		}
	}
	return probe.Result{Name: n, Reason: "unknown strategy"}
}

// recordStartupFailure leaves the reason a daemon did not start where
// `status` finds it.
func recordStartupFailure(l home.Layout, err error) {
	if os.MkdirAll(l.RunDir(), 0o700) != nil {
		return
	}
	msg := fmt.Sprintf("%s: the daemon did not start (pid %d): %v\n", time.Now().UTC().Format(time.RFC3339), os.Getpid(), err)
	os.WriteFile(l.StartupFailurePath(), []byte(msg), 0o600)
}
