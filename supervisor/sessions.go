package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/cgroupfs"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/hostuser"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/protect"
	"github.com/agentconnect-md/agentconnect/internal/steps"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/limits"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

const (
	// DefaultStopTimeout is how long `session stop` waits after SIGTERM
	// before it sends SIGKILL.
	DefaultStopTimeout = 10 * time.Second
	// killWait bounds waiting for a session to end after SIGKILL.
	killWait = 10 * time.Second
	// shimExitWait is how long a dropped connection waits for the shim
	// process to be gone before deciding what happened to it.
	shimExitWait = time.Second
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (s *Supervisor) sessionLog(ss *sessionState) *logrus.Entry {
	rec := ss.record()
	return s.log.WithFields(logrus.Fields{"session": ss.id, "agent": rec.Agent})
}

// lookupSession finds a session by id or by a unique prefix of 4 or more.
func (s *Supervisor) lookupSession(id string) (*sessionState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss, ok := s.sessions[id]; ok {
		return ss, nil
	}
	var found *sessionState
	if len(id) >= 4 {
		for sid, ss := range s.sessions {
			if strings.HasPrefix(sid, id) {
				if found != nil {
					return nil, errdefs.InvalidArgument("session id %q is ambiguous: give more of it", id)
				}
				found = ss
			}
		}
	}
	if found == nil {
		return nil, errdefs.NotFound("no session %q (session ls lists them)", id)
	}
	return found, nil
}

func (s *Supervisor) listSessions(agentName string) []view {
	s.mu.Lock()
	all := make([]*sessionState, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	out := make([]view, 0, len(all))
	for _, ss := range all {
		v := ss.view()
		if agentName == "" || v.Agent == agentName {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// buildSpec is what a run of a session of a executes: its runtime, its
// environment, its directories resolved again now, and its limits; and the
// variables for the shim's memory only (startRun), never session.json.
func (s *Supervisor) buildSpec(a agent.Agent, command []string) (session.Spec, runSecrets, error) {
	if err := s.checkStrategy(a.Strategy); err != nil {
		return session.Spec{}, runSecrets{}, fmt.Errorf("agent %s: %w", a.Name, err)
	}
	agentDir := s.store.AgentDir(a.ID)
	if err := s.store.EnsureWorkspace(&a); err != nil {
		return session.Spec{}, runSecrets{}, errdefs.FailedPrecondition("%v", err)
	}
	workspace := a.SharedWorkspace
	if workspace == "" {
		// Resolved again at every start: a symlink planted since must not
		// move the workspace out of the agent directory.
		ws, err := agent.ResolveInside(agentDir, a.Workspace)
		if err != nil {
			return session.Spec{}, runSecrets{}, errdefs.FailedPrecondition("agent %s: workspace %s: %v", a.Name, a.Workspace, err)
		}
		workspace = ws
	} else if fi, err := os.Stat(workspace); err != nil || !fi.IsDir() {
		return session.Spec{}, runSecrets{}, errdefs.FailedPrecondition("agent %s: shared workspace %s is gone", a.Name, workspace)
	}
	spec := session.Spec{
		Strategy:  a.Strategy,
		Command:   a.Command,
		Workspace: workspace,
		Home:      filepath.Join(agentDir, agent.HomeDir),
		Tmp:       filepath.Join(agentDir, agent.TmpDir),
		Memory:    filepath.Join(agentDir, agent.MemoryDir),
		Limits: session.Limits{
			Pids: int64(a.Resources.Pids), MemoryMiB: int64(a.Resources.MemoryMiB), CPUs: a.Resources.CPUs,
		},
		OutputLimitMiB: int64(s.cfg.OutputLimitMiB),
	}
	rt, err := s.runtimeFor(a)
	if err != nil {
		return session.Spec{}, runSecrets{}, err
	}
	if rt.name != "" {
		spec.Command, spec.NativeSandbox = rt.command, rt.native
	}
	if len(command) > 0 {
		spec.Command, spec.CommandOverride = command, true
	}
	for _, d := range []string{spec.Home, spec.Tmp, spec.Memory} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return session.Spec{}, runSecrets{}, fmt.Errorf("agent %s: %w", a.Name, err)
		}
	}
	if a.Strategy == strategy.Host && s.hostUser != nil {
		spec.RunAs = s.hostUser
		if err := handOver(agentDir, spec, a.SharedWorkspace == ""); err != nil {
			return session.Spec{}, runSecrets{}, fmt.Errorf("agent %s: hand its directories to sandbox.host.user %s: %w", a.Name, s.hostUser.Name, err)
		}
	}
	recorded, private, err := s.secretEnv(a)
	if err != nil {
		return session.Spec{}, runSecrets{}, err
	}
	if a.Login != nil {
		if err := writeLogin(spec.Home, a.Login, private.login, spec.RunAs); err != nil {
			return session.Spec{}, runSecrets{}, fmt.Errorf("agent %s: %w", a.Name, err)
		}
	}
	spec.Env = session.MergeEnv(runtimeEnv(session.MergeEnv(rt.env, a.Env), spec.Home, spec.Tmp), recorded)
	if a.Strategy == strategy.SRT {
		// Its only network is the policy proxy on its loopback; the shim
		// points the proxy variables at it.
		spec.Sandbox = s.sandboxSpec(a, agentDir)
		spec.Sandbox.Mounts = append(spec.Sandbox.Mounts, rt.mounts...)
	}
	if a.Strategy == strategy.Microsandbox {
		// cpus and memory size the VM; the cgroup keeps only its pids limit.
		spec.Limits = session.Limits{Pids: int64(a.Resources.Pids)}
		spec.Sandbox = s.sandboxSpec(a, agentDir)
		// A share cannot hide a path inside it from the guest's root: a
		// credential file in one is refused unless the agent opted it in.
		if exposed := exposedCredentials(a, spec.Sandbox.Credentials); len(exposed) > 0 {
			return session.Spec{}, runSecrets{}, errdefs.FailedPrecondition("agent %s: a mount or the shared workspace holds credential files of the daemon's user, which a microsandbox share cannot hide: %s; mount a narrower directory, or opt one in with agent edit %s --allow-credential NAME",
				a.Name, strings.Join(exposed, ", "), a.Name)
		}
		spec.Sandbox.Resolver = s.cfg.VM.Resolver
		vm, err := s.vmSpec(a, spec, rt.mounts)
		if err != nil {
			return session.Spec{}, runSecrets{}, err
		}
		spec.VM = vm
	}
	if s.cgroups == nil {
		if spec.Limits != (session.Limits{}) {
			return session.Spec{}, runSecrets{}, errdefs.FailedPrecondition(
				"agent %s asks for limits (%s) but this daemon cannot apply them: %s", a.Name, describeLimits(spec.Limits), s.cgSupport.Reason)
		}
		spec.LimitsNote = "none: " + s.cgSupport.Reason
	} else {
		l := spec.Limits
		if l.Pids == 0 {
			l.Pids = limits.DefaultPids
		}
		spec.LimitsNote = describeLimits(l)
	}
	return spec, private, nil
}

// handOver lets spec.RunAs through agentDir (the search bit) and gives it
// the agent's home, tmp and memory, and its workspace when it is the
// agent's own (a shared workspace stays as its owner keeps it).
func handOver(agentDir string, spec session.Spec, ownWorkspace bool) error {
	if err := hostuser.OpenPath(agentDir); err != nil {
		return err
	}
	dirs := []string{spec.Home, spec.Tmp, spec.Memory}
	if ownWorkspace {
		dirs = append(dirs, spec.Workspace)
	}
	for _, d := range dirs {
		if err := hostuser.Own(d, spec.RunAs); err != nil {
			return err
		}
	}
	return nil
}

// runtimeRun is how a run starts an agent's known runtime.
type runtimeRun struct {
	name    string
	command []string
	env     []string
	mounts  []session.Mount // its tree and settings, read-only, where a boundary has one
	native  string          // its own sandbox: on, or off and why
}

// runtimeFor is how a's runtime runs in a's strategy: on host from the
// cache's tree itself, inside srt and microsandbox from the tree mounted
// read-only at runtimes.Target. The zero runtimeRun for an agent without
// a known runtime.
func (s *Supervisor) runtimeFor(a agent.Agent) (runtimeRun, error) {
	if a.Runtime == "" {
		return runtimeRun{}, nil
	}
	rt := runtimes.Known[a.Runtime]
	in, ok := s.runtimes.Get(a.Runtime)
	if !ok {
		return runtimeRun{}, errdefs.FailedPrecondition("agent %s: runtime %s is not in the runtime cache: agentconnect runtime install %s", a.Name, a.Runtime, a.Runtime)
	}
	ns, err := s.nativeSandboxFor(a)
	if err != nil {
		return runtimeRun{}, fmt.Errorf("agent %s: %w", a.Name, err)
	}
	run := runtimeRun{name: a.Runtime, env: rt.Env, native: ns.note}
	if a.Strategy == strategy.Microsandbox {
		run.env = session.MergeEnv(rt.Env, rt.VMEnv)
	}
	args := append(slices.Clone(a.RuntimeArgs), ns.args...)
	tree := s.runtimes.Dir(in)
	if a.Strategy == strategy.Host {
		if why := s.refusesRoot(a); why != "" {
			return runtimeRun{}, errdefs.FailedPrecondition("agent %s: %s", a.Name, why)
		}
		run.command = rt.Command(tree, args)
		return run, nil
	}
	target := runtimes.Target(a.Runtime)
	run.command = rt.Command(target, args)
	run.mounts = append([]session.Mount{{Source: tree, Target: target, ReadOnly: true}}, ns.mounts...)
	return run, nil
}

// refusesRoot says why a's known runtime will not start on host here (it
// refuses root, and this daemon would run it as root), with the ways out;
// "" when it starts.
func (s *Supervisor) refusesRoot(a agent.Agent) string {
	rt, known := runtimes.Known[a.Runtime]
	if !known || a.Strategy != strategy.Host || rt.RefusesRoot == "" || os.Geteuid() != 0 || s.hostUser != nil || hasEnv(a.Env, rt.RootSwitch) {
		return ""
	}
	return fmt.Sprintf("%s, and this daemon runs as root with no sandbox on host: "+
		"set sandbox.host.user in the daemon's config (\"sandbox\": {\"host\": {\"user\": \"agentconnect\"}}) to run host runtimes as that account, "+
		"run the daemon as an unprivileged user (the systemd unit runs as agentconnect), use --strategy srt or microsandbox, "+
		"or, if this host is a disposable sandbox of its own, add %s=1 to the agent's env (agent edit %s --env, with its other variables: the list is replaced)",
		rt.RefusesRoot, rt.RootSwitch, a.Name)
}

// hasEnv reports whether env (KEY=VALUE) sets key.
func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

func describeLimits(l session.Limits) string {
	parts := []string{}
	if l.Pids > 0 {
		parts = append(parts, fmt.Sprintf("pids %d", l.Pids))
	}
	if l.MemoryMiB > 0 {
		parts = append(parts, fmt.Sprintf("memory %d MiB", l.MemoryMiB))
	}
	if l.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("cpus %d", l.CPUs))
	}
	return strings.Join(parts, ", ")
}

// runtimeEnv is a runtime's whole environment: a clean base, the agent's
// variables over it, then HOME and TMPDIR. The daemon's own environment,
// secrets included, never leaks in.
func runtimeEnv(agentEnv []string, homeDir, tmp string) []string {
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	lang := os.Getenv("LANG")
	if lang == "" {
		lang = "C.UTF-8"
	}
	base := []string{"PATH=" + path, "LANG=" + lang, "TERM=dumb"}
	return session.MergeEnv(session.MergeEnv(base, agentEnv), []string{"HOME=" + homeDir, "TMPDIR=" + tmp})
}

// doneStartingLocked ends one start of a run of agent id; the caller holds
// s.mu.
func (s *Supervisor) doneStartingLocked(id string) {
	if s.starting[id]--; s.starting[id] <= 0 {
		delete(s.starting, id)
	}
}

// startSession creates a session of the agent called agentName and runs it,
// for a caller waiting on ctx. A caller that gives up before the start
// answers (its deadline, a closed connection) gets an error and never learns
// the session's id: the session is stopped and removed again, so that a
// start that answers with an error leaves nothing.
func (s *Supervisor) startSession(ctx context.Context, agentName string, command []string) (view, error) {
	v, err := s.createAndRun(ctx, agentName, command)
	if err != nil || ctx.Err() == nil || s.ctx.Err() != nil {
		// (A supervisor that stops closes its callers' connections: its
		// sessions keep running, this one too.)
		return v, err
	}
	log := s.log.WithField("session", v.ID)
	if rerr := s.removeSession(v.ID, true); rerr != nil {
		log.WithError(rerr).Warn("start abandoned by its caller: the session could not be removed")
		return view{}, fmt.Errorf("start of session %s: %w; its caller gave up before it answered, and removing the session failed: %v (session rm --force %s)", v.ID, context.Cause(ctx), rerr, v.ID)
	}
	log.Info("start abandoned by its caller: session stopped and removed")
	return view{}, fmt.Errorf("start of session %s: %w; its caller gave up before it answered, so the session was stopped and removed", v.ID, context.Cause(ctx))
}

// createAndRun creates a session of the agent called agentName and runs it;
// a cold start waits for a start slot (startGate) while ctx lasts. From the
// moment the agent is read until the session is registered, the start is
// counted in s.starting, so that the agent cannot be removed in between
// (deleteAgent refuses while a start is counted): there is never a session
// of a removed agent, nor a run in a removed agent directory.
func (s *Supervisor) createAndRun(ctx context.Context, agentName string, command []string) (view, error) {
	s.mu.Lock()
	a, err := s.agentByNameLocked(agentName)
	var ag agent.Agent
	if err == nil {
		ag = *a
		s.starting[ag.ID]++
	}
	s.mu.Unlock()
	if err != nil {
		return view{}, err
	}
	registered := false
	defer func() {
		if !registered {
			s.mu.Lock()
			s.doneStartingLocked(ag.ID)
			s.mu.Unlock()
		}
	}()
	st := steps.New()
	spec, private, err := s.buildSpec(ag, command)
	if err != nil {
		return view{}, err
	}
	st.Done("spec")
	var warm *warmShim
	if warmable(ag) {
		warm = s.claimWarm(ag, spec)
		defer s.refillWarm(ag.ID, warm)
		if warm != nil {
			st.Done("claim")
		}
	}
	var dir session.Dir
	var rec *session.Record
	if warm != nil {
		// The session's own goes into the record the warm shim was built
		// from; the shim reads it back at Start.
		dir, rec = warm.dir, warm.rec
		rec.Warm, rec.CreatedAt = false, time.Now().UTC()
		rec.Spec.Command, rec.Spec.CommandOverride, rec.Spec.Env = spec.Command, spec.CommandOverride, spec.Env
	} else {
		id := agent.NewID()
		dir = session.Dir(s.layout.SessionDir(id))
		if err := os.Mkdir(string(dir), 0o700); err != nil {
			return view{}, fmt.Errorf("create session: %w", err)
		}
		// The log exists from the start, so that followers can watch it.
		if f, err := os.OpenFile(dir.OutputPath(), os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			f.Close()
		}
		rec = &session.Record{
			ID: id, AgentID: ag.ID, Agent: ag.Name, Strategy: ag.Strategy,
			CreatedAt: time.Now().UTC(), Run: 1, Spec: spec,
		}
	}
	ss := newSessionState(dir, rec)
	ss.opMu.Lock()
	defer ss.opMu.Unlock()
	if warm != nil {
		err = s.runWarm(ss, warm, private, st)
	} else {
		err = s.startRun(ctx, ss, rec, private, st)
	}
	if err != nil {
		s.removeSessionFiles(rec.ID)
		return view{}, err
	}
	s.mu.Lock()
	s.sessions[rec.ID] = ss
	s.doneStartingLocked(ag.ID)
	registered = true
	s.mu.Unlock()
	v := ss.view()
	s.events.add(event{Type: "session.started", SessionID: rec.ID, Agent: ag.Name, Message: fmt.Sprintf("pid %d", v.PID)})
	return v, nil
}

// runWarm starts the session ss in the warm shim it claimed: its record,
// rewritten with what is the session's own, then the runtime. On an error
// nothing of the run is left.
func (s *Supervisor) runWarm(ss *sessionState, w *warmShim, private runSecrets, st *steps.Steps) error {
	// The record replaces the warm build's, which a power loss would take
	// with the claim anyway: it is written and synced beside the Start call.
	// A shim of API version 6 takes the claim with Start (~1 ms less of a
	// warm start); an older one reads it from session.json at Start, so
	// there the write comes first.
	written, synced := make(chan error, 1), make(chan error, 1)
	go func() {
		err := ss.dir.WriteRecordUnsynced(w.rec)
		written <- err
		if err == nil {
			err = ss.dir.SyncRecord()
		}
		synced <- err
	}()
	call := startCall{private: private, written: written}
	if w.conn.apiVersion >= shimv1.ClaimAPIVersion {
		call.claim = &shimv1.Claim{Command: w.rec.Spec.Command, CommandOverride: w.rec.Spec.CommandOverride, Env: w.rec.Spec.Env, CreatedAt: w.rec.CreatedAt}
	} else {
		if err := <-written; err != nil {
			<-synced
			s.discardWarm(w)
			return err
		}
		st.Done("record")
		call.written = nil
	}
	err := s.runShim(ss, w.rec, w.conn, w.boot, call, st)
	// Waited for on every path: nothing may write the record once the
	// caller removes a failed session's files.
	if serr := <-synced; serr != nil && err == nil {
		// The session runs (or ended), and its record is written: only a
		// power loss could still take it.
		s.log.WithError(serr).WithField("session", w.rec.ID).Error("session.json is not on disk yet")
	}
	if err != nil {
		s.removeRunLeftovers(w.rec)
		return err
	}
	return nil
}

// startRun starts one run of a session: its cgroup, its shim, its runtime
// (with private, the variables only the shim's memory holds), once one of
// its strategy's start slots is free (waiting while wait lasts). On an
// error nothing of the run is left; a runtime that could not start leaves
// the session exited with the reason. st times the steps, for the log.
func (s *Supervisor) startRun(wait context.Context, ss *sessionState, rec *session.Record, private runSecrets, st *steps.Steps) error {
	release, waited, err := s.gate.acquire(wait, s.ctx, rec.Strategy)
	if err != nil {
		// Its caller is gone: the log is where this is seen.
		s.log.WithFields(logrus.Fields{"session": rec.ID, "agent": rec.Agent}).WithError(err).Warn("start not made")
		return err
	}
	defer release()
	if waited {
		st.Done("wait for a start slot")
	}
	// The next spare starts once this session wrote, not beside its start.
	defer s.afterFirstOutput(ss.dir, func() { s.fillSpare(rec.Strategy) })
	conn, boot, err := s.launchShim(s.ctx, ss.dir, rec, st)
	if err != nil {
		return err
	}
	if err := s.runShim(ss, rec, conn, boot, startCall{private: private}, st); err != nil {
		s.removeRunLeftovers(rec)
		return err
	}
	return nil
}

// launchShim makes a run's cgroup (and places its VM), writes its record,
// and starts and connects to its shim; ctx ends the bootstrap and the dial.
// On an error nothing of it is left. st times the steps.
//
// The shim's bootstrap (its process start until it is ready, ~3-4 ms)
// needs neither a cold run's cgroup nor a new session's record on disk: the
// shim reads the record, and touches the cgroup only at Start. Both are
// done beside it, and launchShim returns once they are. A warm build
// prepares its run before it reports ready, so its cgroup comes first; a
// resumed session's record replaces one that a power loss must not tear,
// so it is synced before the shim starts.
func (s *Supervisor) launchShim(ctx context.Context, dir session.Dir, rec *session.Record, st *steps.Steps) (_ *shimConn, _ *session.Bootstrap, retErr error) {
	var beside errgroup.Group
	defer beside.Wait() // on an early return: nothing of ours runs on
	if s.cgroups != nil {
		cg := cgroupfs.Cgroup{Dirs: s.cgroups.Dirs(rec.ID)}
		rec.Spec.Cgroup = cg.Dirs
		defer func() {
			if retErr != nil {
				beside.Wait()
				cg.Remove()
			}
		}()
		if rec.Warm {
			if _, err := s.cgroups.Create(rec.ID, rec.Spec.Limits); err != nil {
				return nil, nil, err
			}
			// A build ahead of any session yields the CPU to those that
			// run (a VM's boot takes a core for seconds); claimWarm gives
			// the cgroup its weight back.
			if err := cg.SetBackground(true); err != nil {
				s.log.WithError(err).WithField("warm", rec.ID).Warn("build a warm boundary at background priority")
			}
			st.Done("cgroup")
		} else {
			beside.Go(func() error {
				_, err := s.cgroups.Create(rec.ID, rec.Spec.Limits)
				return err
			})
		}
	}
	if rec.Spec.VM != nil {
		if err := s.placeVM(rec); err != nil {
			return nil, nil, err
		}
	}
	if rec.Run == 1 && !rec.Warm {
		if err := dir.WriteRecordUnsynced(rec); err != nil {
			return nil, nil, err
		}
		beside.Go(dir.SyncRecord)
	} else if err := dir.WriteRecord(rec); err != nil {
		return nil, nil, err
	}
	st.Done("record")
	socket := home.ShimSocket(s.socketDir, rec.ID, rec.Run)
	timeout := bootstrapTimeout
	if rec.Warm {
		timeout = warmBootstrapTimeout
	}
	// A warm build is ahead of any session: a spare is for the starts a
	// session waits for.
	boot, spared, err := s.bootstrapShim(ctx, dir, rec.Strategy, rec.Run, socket, timeout, !rec.Warm)
	if err != nil {
		return nil, nil, err
	}
	if spared {
		st.Done("spare shim")
	} else {
		st.Done("shim")
	}
	conn, err := dialShim(ctx, boot, dialTimeout)
	if err == nil {
		st.Done("dial")
		if err = beside.Wait(); err != nil {
			conn.close()
		}
	}
	if err != nil {
		s.stopShim(boot)
		os.Remove(socket)
		return nil, nil, err
	}
	st.Done("cgroup and fsync beside it")
	return conn, boot, nil
}

// startCall is what a Start call carries besides the session's record.
type startCall struct {
	// private is the run's env and secret bindings, for the shim's memory.
	private runSecrets
	// claim binds a session to the warm shim it claimed (shimv1.Claim).
	claim *shimv1.Claim
	// written, when not nil, reports the write of the claim's record,
	// made beside the call: the run is the session's once both succeeded.
	written <-chan error
}

// runShim starts the runtime of a launched shim and follows it. An error
// that is returned leaves the shim stopped and the run's leftovers for the
// caller to remove; a runtime that could not start leaves the session
// exited with the reason (nil error). The log line of a started session
// has st's steps.
func (s *Supervisor) runShim(ss *sessionState, rec *session.Record, conn *shimConn, boot *session.Bootstrap, call startCall, st *steps.Steps) error {
	log := s.log.WithFields(logrus.Fields{"session": rec.ID, "agent": rec.Agent, "run": rec.Run})
	private := call.private
	if err := shimCanRun(conn.apiVersion, rec, private); err != nil {
		conn.close()
		s.stopShim(boot)
		return errdefs.FailedPrecondition("session %s: the shim (pid %d) %v; install agentconnect and its shims together (make install)", rec.ID, boot.PID, err)
	}
	timeout := s.startTimeout()
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	resp, err := conn.shim.Start(ctx, &shimv1.StartRequest{Env: private.env, Secrets: private.bindings, Claim: call.claim})
	cancel()
	if call.written != nil {
		if werr := <-call.written; werr != nil {
			// Started or not, the run cannot be the session's.
			conn.close()
			s.stopShim(boot)
			return fmt.Errorf("session %s: write the claimed session's record: %w", rec.ID, werr)
		}
	}
	if err != nil {
		st := s.failedStart(ss, rec, conn, boot, err, timeout)
		ss.setEnded(st)
		log.WithField("reason", st.Reason).Warn("session did not start")
		return nil
	}
	st.Done("start")
	ss.setRunning(conn, int(resp.Pid), time.Now())
	log.WithFields(logrus.Fields{"pid": resp.Pid, "shim": boot.PID, "steps": st.String()}).Info("session running")
	go s.monitor(ss, conn, rec.Run)
	return nil
}

// shimCanRun refuses a run that a shim speaking shim API version cannot
// carry out as asked: it would drop secrets, or run as itself (root) what
// should run as spec.runAs.
func shimCanRun(version uint32, rec *session.Record, private runSecrets) error {
	renewed := slices.ContainsFunc(private.bindings, func(b *shimv1.Secret) bool { return b.TokenField != "" })
	if (len(private.env) > 0 || len(private.bindings) > 0) && version < shimv1.PrivateEnvAPIVersion ||
		renewed && version < shimv1.RenewAPIVersion {
		return fmt.Errorf("speaks shim API %d, which cannot take secrets", version)
	}
	if rec.Spec.RunAs != nil && version < shimv1.RunAsAPIVersion {
		return fmt.Errorf("speaks shim API %d, which would run the runtime as itself, not as %s", version, rec.Spec.RunAs.Name)
	}
	return nil
}

// startTimeout bounds the Start call of a run.
func (s *Supervisor) startTimeout() time.Duration {
	if s.opts.StartTimeout > 0 {
		return s.opts.StartTimeout
	}
	return startTimeout
}

// failedStart ends a run whose Start call failed and leaves nothing of it
// behind. A shim that answered has recorded why in status.json and exits
// once told to; one that did not answer in time (a VM still booting, a
// wedged shim) is killed, and so is one that does not exit. Then what the
// run started goes with its cgroup, and its socket, VM runtime directory
// and placeholders go, before the failure is reported. A supervisor that
// is stopping leaves the shim alone: the next one adopts it.
func (s *Supervisor) failedStart(ss *sessionState, rec *session.Record, conn *shimConn, boot *session.Bootstrap, startErr error, timeout time.Duration) *session.Status {
	if s.ctx.Err() != nil {
		conn.close()
		return &session.Status{Run: rec.Run, State: session.Exited, ExitCode: -1, ExitedAt: time.Now().UTC(),
			Reason: "the daemon stopped while the session was starting; the next daemon adopts it"}
	}
	st, _ := ss.dir.ReadStatus()
	answered := st != nil && st.Run == rec.Run && st.State != session.Running
	if answered {
		ctx, cancel := context.WithTimeout(s.ctx, callTimeout)
		conn.shim.Shutdown(ctx, &shimv1.ShutdownRequest{})
		cancel()
	}
	conn.close()
	if !answered || !waitGone(boot.PID, boot.StartTime, shimExitTimeout) {
		s.stopShim(boot)
	}
	s.removeRunLeftovers(rec)
	if answered {
		return st
	}
	reason := fmt.Sprintf("start: %v; the shim (pid %d) was stopped, and what it had started", startErr, boot.PID)
	if errors.Is(startErr, context.DeadlineExceeded) {
		reason = fmt.Sprintf("the start did not finish within %v; the shim (pid %d) was stopped, and what it had started", timeout, boot.PID)
	}
	st = &session.Status{Run: rec.Run, State: session.Exited, ExitCode: -1, Reason: reason, ExitedAt: time.Now().UTC()}
	if err := ss.dir.WriteStatus(st); err != nil {
		s.log.WithError(err).WithField("session", rec.ID).Error("record the failed start")
	}
	return st
}

// waitGone waits until pid, started at startTime, is no longer running, at
// most timeout, and reports whether it is gone.
func waitGone(pid int, startTime uint64, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for procstat.Alive(pid, startTime) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// monitor waits for the end of a run through its shim, and records it.
func (s *Supervisor) monitor(ss *sessionState, conn *shimConn, run uint32) {
	var violations *violationFollower
	if ss.record().Spec.Sandbox != nil {
		violations = s.followViolations(ss)
	}
	renewals := s.followRenewals(ss, conn)
	resp, err := conn.shim.Wait(s.ctx, &shimv1.WaitRequest{})
	violations.finish() // the run's last refusals, before its exit is told
	if err == nil {
		// The run's last renewals are stored before its end is told.
		select {
		case <-renewals:
		case <-time.After(callTimeout):
		}
	}
	if s.ctx.Err() != nil {
		return // the supervisor is stopping; the shim carries on
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(s.ctx, callTimeout)
		conn.shim.Shutdown(ctx, &shimv1.ShutdownRequest{})
		cancel()
		conn.close()
		st, rerr := ss.dir.ReadStatus()
		if rerr != nil || st == nil || st.Run != run {
			st = &session.Status{Run: run, State: session.Exited, ExitCode: int(resp.ExitCode), Reason: resp.Reason, ExitedAt: resp.ExitedAt}
		}
		// The shim removes its socket and cgroup as it exits; make sure of
		// it before the end is reported, so that nothing is left once a
		// stop returns.
		s.removeRunLeftovers(ss.record())
		s.ended(ss, st)
		return
	}
	conn.close()
	s.collectDeadShim(ss, run, conn.pid, conn.startTime)
}

// ended records the end of a run and tells whoever follows the events.
func (s *Supervisor) ended(ss *sessionState, st *session.Status) {
	ss.setEnded(st)
	log := s.sessionLog(ss).WithFields(logrus.Fields{"exitCode": st.ExitCode, "reason": st.Reason})
	if st.State == session.Lost {
		log.Warn("session lost")
	} else {
		log.Info("session exited")
	}
	s.events.add(event{Type: "session." + st.State, SessionID: ss.id, Agent: ss.record().Agent, ExitCode: st.ExitCode, Message: st.Reason})
}

// collectDeadShim decides what happened to a run whose shim connection
// dropped: an exit the shim recorded, or a lost session, cleaned up.
func (s *Supervisor) collectDeadShim(ss *sessionState, run uint32, shimPID int, shimStart uint64) {
	if !diesWithin(shimPID, shimStart, shimExitWait) {
		// The shim lives but its connection broke: adopt it again.
		boot, _ := ss.dir.ReadBootstrap()
		if boot != nil && boot.PID == shimPID {
			go s.readopt(ss, boot)
			return
		}
	}
	st, _ := ss.dir.ReadStatus()
	if st != nil && st.Run == run && st.State != session.Running {
		s.ended(ss, st)
		return
	}
	s.ended(ss, s.lose(ss.record(), st, fmt.Sprintf("shim (pid %d) died without recording an exit", shimPID)))
}

// lose marks a run lost: it kills what is left of it, removes its cgroup
// and socket, and records the reason in status.json.
func (s *Supervisor) lose(rec *session.Record, last *session.Status, reason string) *session.Status {
	st := &session.Status{Run: rec.Run, State: session.Lost, ExitCode: -1, Reason: reason, ExitedAt: time.Now().UTC()}
	if last != nil && last.Run == rec.Run {
		st.PID, st.StartedAt = last.PID, last.StartedAt
		// The runtime died with its shim (Pdeathsig); its children may not
		// have: they are in its process group and its cgroup. The group is
		// signalled only while its leader is still the recorded process:
		// after a reboot or a long downtime the pid may be another's (see
		// procstat.SignalGroup for why a dead leader's group is not
		// signalled). The cgroup kill below takes whatever else is left.
		if last.PID > 1 {
			err := procstat.SignalGroup(last.PID, last.PIDStartTime, syscall.SIGKILL)
			log := s.log.WithFields(logrus.Fields{"session": rec.ID, "pid": last.PID})
			switch {
			case errors.Is(err, procstat.ErrNotSame):
				log.Info("the lost run's pid is another process now (or has no recorded start time): not signalled")
			case err != nil && len(rec.Spec.Cgroup) == 0:
				log.Warn("the lost run's runtime is gone, and without a cgroup what outlived it cannot be told from other processes: not signalled")
			}
		}
	}
	s.removeRunLeftovers(rec)
	if err := session.Dir(s.layout.SessionDir(rec.ID)).WriteStatus(st); err != nil {
		s.log.WithError(err).WithField("session", rec.ID).Error("record lost session")
	}
	return st
}

// removeSessionFiles removes the directories of a session that never
// started or is gone: its own and its VM's.
func (s *Supervisor) removeSessionFiles(id string) {
	os.RemoveAll(filepath.Join(s.layout.VMsDir(), id))
	os.RemoveAll(s.layout.SessionDir(id))
}

// removeRunLeftovers kills and removes a run's cgroup, its socket, a VM's
// runtime directory and the placeholders of its boundary.
func (s *Supervisor) removeRunLeftovers(rec *session.Record) {
	if len(rec.Spec.Cgroup) > 0 {
		cg := cgroupfs.Cgroup{Dirs: rec.Spec.Cgroup}
		if err := cg.Kill(killWait); err != nil {
			s.log.WithError(err).WithField("session", rec.ID).Warn("kill what is left of the session")
		}
		cg.Remove()
	}
	os.Remove(home.ShimSocket(s.socketDir, rec.ID, rec.Run))
	if vm := rec.Spec.VM; vm != nil && vm.RunDir != "" {
		os.RemoveAll(vm.RunDir)
	}
	if sb := rec.Spec.Sandbox; sb != nil {
		// The placeholders of a shim that was killed (srt's and a VM's
		// shares' alike); a live shim's, and those of any other boundary
		// still running, stay.
		protect.ReleaseDead(protect.LedgerPath(sb.DaemonHome))
	}
}

// stopSession ends the run: SIGTERM to every process of the session, then
// SIGKILL after the timeout.
func (s *Supervisor) stopSession(id string, timeout time.Duration) (view, error) {
	ss, err := s.lookupSession(id)
	if err != nil {
		return view{}, err
	}
	ss.opMu.Lock()
	defer ss.opMu.Unlock()
	if timeout == 0 {
		timeout = DefaultStopTimeout
	}
	if err := s.endRun(ss, timeout); err != nil {
		return view{}, err
	}
	return ss.view(), nil
}

// endRun stops a running session and waits until its end is recorded:
// SIGTERM to every process of the session, then SIGKILL once grace has
// passed (at once when grace is zero).
func (s *Supervisor) endRun(ss *sessionState, grace time.Duration) error {
	if !ss.isRunning() {
		return nil
	}
	conn, done, err := s.reachShim(ss)
	if err != nil {
		return err
	}
	defer done()
	s.sessionLog(ss).WithField("grace", grace).Info("stopping session")
	steps := []struct {
		sig  syscall.Signal
		wait time.Duration
	}{{syscall.SIGTERM, grace}, {syscall.SIGKILL, killWait}}
	if grace == 0 {
		steps = steps[1:]
	}
	for _, step := range steps {
		// The signal is one short call; the wait for the end is the grace.
		callCtx, cancel := context.WithTimeout(s.ctx, callTimeout)
		_, err := conn.shim.Kill(callCtx, &shimv1.KillRequest{Signal: uint32(step.sig), All: true})
		cancel()
		// A run that ended meanwhile is not an error: its shim says so, or
		// has already closed the connection.
		if err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) && !errors.Is(err, ttrpclite.ErrClosed) {
			s.sessionLog(ss).WithError(err).Warnf("send %v", step.sig)
		}
		ctx, cancel := context.WithTimeout(s.ctx, step.wait)
		err = ss.wait(ctx)
		cancel()
		if err == nil {
			return nil
		}
	}
	return errdefs.Unavailable("session %s did not end after SIGKILL", ss.id)
}

// reachShim is the connection to a running session's shim, for a signal;
// call done when finished with it. A shim that is alive but not adopted yet
// (its VM still boots under a new supervisor: adopt gave up waiting for the
// start) gets a connection of its own, since it keeps a signal for a run
// that starts.
func (s *Supervisor) reachShim(ss *sessionState) (conn *shimConn, done func(), err error) {
	if conn := ss.connection(); conn != nil {
		return conn, func() {}, nil
	}
	boot, err := ss.dir.ReadBootstrap()
	switch {
	case err != nil || boot == nil || boot.Run != ss.record().Run:
		err = fmt.Errorf("bootstrap.json does not name the run's shim: %v", err)
	case !procstat.Alive(boot.PID, boot.StartTime):
		err = fmt.Errorf("shim (pid %d) is gone", boot.PID)
	default:
		conn, err = dialShim(s.ctx, boot, dialTimeout)
	}
	if err != nil {
		return nil, nil, errdefs.Unavailable("the shim of session %s is not answering (%v); try again", ss.id, err)
	}
	return conn, conn.close, nil
}

func (s *Supervisor) killSession(id string, sig syscall.Signal) error {
	ss, err := s.lookupSession(id)
	if err != nil {
		return err
	}
	if !ss.isRunning() {
		return errdefs.FailedPrecondition("session %s is not running", ss.id)
	}
	conn, done, err := s.reachShim(ss)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(s.ctx, callTimeout)
	defer cancel()
	if _, err := conn.shim.Kill(ctx, &shimv1.KillRequest{Signal: uint32(sig)}); err != nil {
		return err
	}
	return nil
}

// resumeSession runs a session that is not running again: same id, its log
// continuing after the old output, with the agent's current settings.
func (s *Supervisor) resumeSession(id string) (view, error) {
	ss, err := s.lookupSession(id)
	if err != nil {
		return view{}, err
	}
	ss.opMu.Lock()
	defer ss.opMu.Unlock()
	if ss.isRunning() {
		return view{}, errdefs.FailedPrecondition("session %s is running", ss.id)
	}
	old := ss.record()
	s.mu.Lock()
	a, ok := s.agents[old.AgentID]
	var ag agent.Agent
	if ok {
		ag = *a
		s.starting[ag.ID]++ // as in startSession: the agent stays until the run is started
	}
	s.mu.Unlock()
	if !ok {
		return view{}, errdefs.FailedPrecondition("the agent of session %s (%s) was removed", ss.id, old.Agent)
	}
	defer func() {
		s.mu.Lock()
		s.doneStartingLocked(ag.ID)
		s.mu.Unlock()
	}()
	var command []string
	if old.Spec.CommandOverride {
		command = old.Spec.Command
	}
	spec, private, err := s.buildSpec(ag, command)
	if err != nil {
		return view{}, err
	}
	rec := *old
	rec.Run, rec.Spec, rec.Agent, rec.Strategy = old.Run+1, spec, ag.Name, ag.Strategy
	ss.mu.Lock()
	ss.rec = &rec
	ss.mu.Unlock()
	if err := s.startRun(s.ctx, ss, &rec, private, steps.New()); err != nil {
		ss.mu.Lock()
		ss.rec = old
		ss.mu.Unlock()
		ss.dir.WriteRecord(old)
		return view{}, err
	}
	s.events.add(event{Type: "session.resumed", SessionID: ss.id, Agent: ag.Name, Message: fmt.Sprintf("run %d", rec.Run)})
	return ss.view(), nil
}

// removeSession deletes a session and everything it owns.
func (s *Supervisor) removeSession(id string, force bool) error {
	ss, err := s.lookupSession(id)
	if err != nil {
		return err
	}
	ss.opMu.Lock()
	defer ss.opMu.Unlock()
	if ss.isRunning() {
		if !force {
			return errdefs.FailedPrecondition("session %s is running: stop it first (session stop %s) or remove it with --force", ss.id, ss.id)
		}
		if err := s.endRun(ss, 0); err != nil {
			return err
		}
	}
	rec := ss.record()
	s.removeRunLeftovers(rec)
	if err := os.RemoveAll(filepath.Join(s.layout.VMsDir(), ss.id)); err != nil {
		s.sessionLog(ss).WithError(err).Warn("remove the session's VM")
	}
	trash := filepath.Join(s.layout.SessionsDir(), ".removing-"+ss.id)
	if err := os.Rename(string(ss.dir), trash); err != nil {
		return fmt.Errorf("remove session %s: %w", ss.id, err)
	}
	s.mu.Lock()
	delete(s.sessions, ss.id)
	s.mu.Unlock()
	ss.markRemoved()
	if err := os.RemoveAll(trash); err != nil {
		s.sessionLog(ss).WithError(err).Warn("remove session files")
	}
	s.events.add(event{Type: "session.removed", SessionID: ss.id, Agent: rec.Agent})
	s.sessionLog(ss).Info("session removed")
	return nil
}

func (s *Supervisor) writeStdin(ctx context.Context, id string, data []byte, record bool) (int, error) {
	ss, err := s.lookupSession(id)
	if err != nil {
		return 0, err
	}
	conn := ss.connection()
	if !ss.isRunning() || conn == nil {
		return 0, errdefs.FailedPrecondition("session %s is not running", ss.id)
	}
	resp, err := conn.shim.WriteStdin(ctx, &shimv1.WriteStdinRequest{Data: data, Record: record})
	if err != nil {
		n := 0
		if resp != nil {
			n = int(resp.Written)
		}
		return n, err
	}
	return int(resp.Written), nil
}

func (s *Supervisor) closeStdin(ctx context.Context, id string) error {
	ss, err := s.lookupSession(id)
	if err != nil {
		return err
	}
	conn := ss.connection()
	if !ss.isRunning() || conn == nil {
		return errdefs.FailedPrecondition("session %s is not running", ss.id)
	}
	if _, err := conn.shim.CloseStdin(ctx, &shimv1.CloseStdinRequest{}); err != nil {
		return err
	}
	return nil
}

func (s *Supervisor) waitSession(ctx context.Context, id string) (view, error) {
	ss, err := s.lookupSession(id)
	if err != nil {
		return view{}, err
	}
	if err := ss.wait(ctx); err != nil {
		return view{}, err
	}
	return ss.view(), nil
}
