package supervisor

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/rpcstatus"
	"github.com/agentconnect-md/agentconnect/internal/version"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/probe"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
	"github.com/agentconnect-md/agentconnect/supervisor/secret"
)

// adminService serves the admin API: it converts messages and maps errors
// to status codes; the work is the Supervisor's.
type adminService struct {
	s *Supervisor
}

func (a *adminService) Status(context.Context, *adminv1.StatusRequest) (*adminv1.StatusResponse, error) {
	s := a.s
	unit, user := systemdUnit()
	resp := &adminv1.StatusResponse{
		Version: version.Version, Pid: uint32(os.Getpid()), Home: s.opts.Home,
		StartedAt:       timestamppb.New(s.startedAt),
		Cgroups:         &adminv1.Cgroups{Available: s.cgSupport.Available, Mode: s.cgSupport.Mode, Reason: s.cgSupport.Reason},
		RequireSandbox:  !s.cfg.Offered[strategy.Host],
		ConfigPath:      s.cfg.Path,
		Warnings:        s.cfg.Warnings,
		SystemdUnit:     unit,
		SystemdUser:     user,
		Args:            s.opts.Args,
		DefaultStrategy: string(probe.Default(s.probes)),
	}
	for _, r := range s.probes {
		resp.Strategies = append(resp.Strategies, &adminv1.Strategy{Name: string(r.Name), Available: r.Available, Reason: r.Reason, Detail: r.Detail})
	}
	for _, v := range s.listSessions("") {
		resp.Sessions++
		if v.State == session.Running {
			resp.Running++
		}
	}
	return resp, nil
}

func (a *adminService) CreateAgent(ctx context.Context, req *adminv1.CreateAgentRequest) (*adminv1.Agent, error) {
	if req.Agent == nil {
		return nil, rpcstatus.ToStatus(errdefs.InvalidArgument("no agent given"))
	}
	ag, err := a.s.createAgent(ctx, agentFromProto(req.Agent))
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return a.agentToProto(ag), nil
}

func (a *adminService) UpdateAgent(ctx context.Context, req *adminv1.UpdateAgentRequest) (*adminv1.Agent, error) {
	if req.Agent == nil {
		return nil, rpcstatus.ToStatus(errdefs.InvalidArgument("no agent given"))
	}
	ag, err := a.s.updateAgent(ctx, req.Name, agentFromProto(req.Agent))
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return a.agentToProto(ag), nil
}

func (a *adminService) GetAgent(_ context.Context, req *adminv1.GetAgentRequest) (*adminv1.Agent, error) {
	ag, err := a.s.getAgent(req.Name)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return a.agentToProto(ag), nil
}

func (a *adminService) ListAgents(context.Context, *adminv1.ListAgentsRequest) (*adminv1.ListAgentsResponse, error) {
	resp := &adminv1.ListAgentsResponse{}
	for _, ag := range a.s.listAgents() {
		resp.Agents = append(resp.Agents, a.agentToProto(ag))
	}
	return resp, nil
}

func (a *adminService) DeleteAgent(_ context.Context, req *adminv1.DeleteAgentRequest) (*adminv1.DeleteAgentResponse, error) {
	if err := a.s.deleteAgent(req.Name); err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.DeleteAgentResponse{}, nil
}

func (a *adminService) SetSecret(_ context.Context, req *adminv1.SetSecretRequest) (*adminv1.Secret, error) {
	sec, err := a.s.setSecret(secret.Secret{
		Name: req.Name, Value: secret.Value(req.Value), Hosts: req.Hosts, Headers: req.Headers, Preset: req.Preset,
		TokenHosts: req.TokenHosts, TokenField: req.TokenField,
	})
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return secretToProto(sec, a.s.secretUsers()[sec.Name]), nil
}

func (a *adminService) ListSecrets(context.Context, *adminv1.ListSecretsRequest) (*adminv1.ListSecretsResponse, error) {
	users := a.s.secretUsers()
	resp := &adminv1.ListSecretsResponse{}
	for _, sec := range a.s.secrets.List() {
		resp.Secrets = append(resp.Secrets, secretToProto(sec, users[sec.Name]))
	}
	return resp, nil
}

func (a *adminService) RemoveSecret(_ context.Context, req *adminv1.RemoveSecretRequest) (*adminv1.RemoveSecretResponse, error) {
	if err := a.s.removeSecret(req.Name, req.Force); err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.RemoveSecretResponse{}, nil
}

func (a *adminService) ListRuntimes(context.Context, *adminv1.ListRuntimesRequest) (*adminv1.ListRuntimesResponse, error) {
	resp := &adminv1.ListRuntimesResponse{}
	for _, name := range runtimes.Names() {
		in, ok := a.s.runtimes.Get(name)
		resp.Runtimes = append(resp.Runtimes, a.runtimeToProto(name, in, ok))
	}
	return resp, nil
}

func (a *adminService) InstallRuntime(ctx context.Context, req *adminv1.InstallRuntimeRequest) (*adminv1.Runtime, error) {
	in, err := a.s.runtimes.Install(ctx, req.Name, req.Update)
	if err != nil {
		a.s.log.WithError(err).WithField("runtime", req.Name).Warn("runtime install failed")
		return nil, rpcstatus.ToStatus(err)
	}
	a.s.log.WithFields(map[string]any{"runtime": in.Name, "version": in.Version, "digest": in.Digest}).Info("runtime installed")
	a.s.events.add(event{Type: "runtime.installed", Message: in.Name + " " + in.Version})
	return a.runtimeToProto(req.Name, in, true), nil
}

func (a *adminService) runtimeToProto(name string, in runtimes.Installed, installed bool) *adminv1.Runtime {
	r := runtimes.Known[name]
	p := &adminv1.Runtime{Name: name, Package: r.Package, Version: r.Version, Installed: installed}
	if installed {
		dir := a.s.runtimes.Dir(in)
		p.InstalledVersion, p.Digest, p.Dir = in.Version, in.Digest, dir
		p.Command = r.Command(dir, nil)
		p.InstalledAt = timestamppb.New(in.InstalledAt)
	}
	return p
}

// secretToProto is a secret as the API shows it: never its value.
func secretToProto(sec secret.Secret, agents []string) *adminv1.Secret {
	return &adminv1.Secret{
		Name: sec.Name, Hosts: sec.Hosts, Headers: sec.Headers, Preset: sec.Preset, Agents: agents,
		CreatedAt: timestamppb.New(sec.CreatedAt), UpdatedAt: timestamppb.New(sec.UpdatedAt),
		TokenHosts: sec.TokenHosts, TokenField: sec.TokenField,
	}
}

func (a *adminService) StartSession(ctx context.Context, req *adminv1.StartSessionRequest) (*adminv1.Session, error) {
	if len(req.Command) > 0 && req.Command[0] == "" {
		return nil, rpcstatus.ToStatus(errdefs.InvalidArgument("empty command"))
	}
	v, err := a.s.startSession(ctx, req.Agent, req.Command)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return sessionToProto(v), nil
}

func (a *adminService) ResumeSession(_ context.Context, req *adminv1.ResumeSessionRequest) (*adminv1.Session, error) {
	v, err := a.s.resumeSession(req.Id)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return sessionToProto(v), nil
}

func (a *adminService) ListSessions(_ context.Context, req *adminv1.ListSessionsRequest) (*adminv1.ListSessionsResponse, error) {
	resp := &adminv1.ListSessionsResponse{}
	for _, v := range a.s.listSessions(req.Agent) {
		resp.Sessions = append(resp.Sessions, sessionToProto(v))
	}
	return resp, nil
}

func (a *adminService) GetSession(ctx context.Context, req *adminv1.GetSessionRequest) (*adminv1.Session, error) {
	ss, err := a.s.lookupSession(req.Id)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	p := sessionToProto(ss.view())
	vs := readViolations(ss.dir)
	p.ViolationCount = vs.Total
	p.ViolationsNotKept = vs.Dropped
	for _, v := range vs.Entries {
		p.Violations = append(p.Violations, &adminv1.Violation{
			Time: timestamppb.New(v.Time), Protocol: v.Protocol, Host: v.Host, Port: uint32(v.Port), Addr: v.Addr, Reason: v.Reason,
			Count: v.Count, FirstTime: timestamppb.New(v.First),
		})
	}
	if conn := ss.connection(); conn != nil && p.Cgroup != "" {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if st, err := conn.shim.Stats(ctx, &shimv1.StatsRequest{}); err == nil {
			p.Usage = &adminv1.Usage{MemoryBytes: st.MemoryBytes, Pids: st.Pids, CpuUsageNs: st.CpuUsageNs}
		}
	}
	return p, nil
}

func (a *adminService) StopSession(_ context.Context, req *adminv1.StopSessionRequest) (*adminv1.Session, error) {
	v, err := a.s.stopSession(req.Id, time.Duration(req.TimeoutSeconds)*time.Second)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return sessionToProto(v), nil
}

func (a *adminService) KillSession(_ context.Context, req *adminv1.KillSessionRequest) (*adminv1.KillSessionResponse, error) {
	sig := syscall.Signal(req.Signal)
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	if sig < 1 || sig > 64 {
		return nil, rpcstatus.ToStatus(errdefs.InvalidArgument("signal %d: want 1 to 64", req.Signal))
	}
	if err := a.s.killSession(req.Id, sig); err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.KillSessionResponse{}, nil
}

func (a *adminService) WaitSession(ctx context.Context, req *adminv1.WaitSessionRequest) (*adminv1.Session, error) {
	v, err := a.s.waitSession(ctx, req.Id)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return sessionToProto(v), nil
}

func (a *adminService) RemoveSession(_ context.Context, req *adminv1.RemoveSessionRequest) (*adminv1.RemoveSessionResponse, error) {
	if err := a.s.removeSession(req.Id, req.Force); err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.RemoveSessionResponse{}, nil
}

func (a *adminService) WriteStdin(ctx context.Context, req *adminv1.WriteStdinRequest) (*adminv1.WriteStdinResponse, error) {
	if len(req.Data) > shimv1.MaxStdinWrite {
		return nil, rpcstatus.ToStatus(errdefs.InvalidArgument("stdin write of %d bytes is over the %d-byte limit: send it in pieces", len(req.Data), shimv1.MaxStdinWrite))
	}
	n, err := a.s.writeStdin(ctx, req.Id, req.Data, req.Record)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.WriteStdinResponse{Written: uint32(n)}, nil
}

func (a *adminService) CloseStdin(ctx context.Context, req *adminv1.CloseStdinRequest) (*adminv1.CloseStdinResponse, error) {
	if err := a.s.closeStdin(ctx, req.Id); err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.CloseStdinResponse{}, nil
}

func (a *adminService) Attach(ctx context.Context, req *adminv1.AttachRequest, srv adminv1.Admin_AttachServer) error {
	return rpcstatus.ToStatus(a.s.attach(ctx, req.Id, int64(req.Offset), req.Follow, req.Stdin, srv.Send))
}

func (a *adminService) Forward(ctx context.Context, req *adminv1.ForwardRequest, srv adminv1.Admin_ForwardServer) error {
	if req.Port < 1 || req.Port > 65535 || req.HostPort > 65535 {
		return rpcstatus.ToStatus(errdefs.InvalidArgument("forward: port %d to host port %d: want ports from 1 to 65535 (host port 0: any free one)", req.Port, req.HostPort))
	}
	return rpcstatus.ToStatus(a.s.forward(ctx, req.Session, req.HostPort, req.Port, req.Detach, func(f *shimv1.Forward) error {
		return srv.Send(forwardToProto(f))
	}))
}

func (a *adminService) Unforward(ctx context.Context, req *adminv1.UnforwardRequest) (*adminv1.UnforwardResponse, error) {
	address := ""
	if req.HostPort != 0 {
		address = fmt.Sprintf("127.0.0.1:%d", req.HostPort)
	}
	n, err := a.s.closeForwards(ctx, req.Session, address, req.All)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	return &adminv1.UnforwardResponse{Closed: uint32(n)}, nil
}

func (a *adminService) ListForwards(ctx context.Context, req *adminv1.ListForwardsRequest) (*adminv1.ListForwardsResponse, error) {
	fs, err := a.s.listForwards(ctx, req.Session)
	if err != nil {
		return nil, rpcstatus.ToStatus(err)
	}
	resp := &adminv1.ListForwardsResponse{}
	for _, f := range fs {
		resp.Forwards = append(resp.Forwards, forwardToProto(f))
	}
	return resp, nil
}

func forwardToProto(f *shimv1.Forward) *adminv1.SessionForward {
	return &adminv1.SessionForward{Address: f.Address, HostPort: f.HostPort, Port: f.Port, Detached: f.Detached, Connections: f.Connections}
}

func (a *adminService) Events(ctx context.Context, req *adminv1.EventsRequest, srv adminv1.Admin_EventsServer) error {
	if !req.Follow {
		for _, e := range a.s.events.snapshot() {
			if err := srv.Send(eventToProto(e)); err != nil {
				return err
			}
		}
		return nil
	}
	past, next, cancel := a.s.events.subscribe()
	defer cancel()
	for _, e := range past {
		if err := srv.Send(eventToProto(e)); err != nil {
			return err
		}
	}
	for {
		select {
		case e, ok := <-next:
			if !ok {
				return rpcstatus.ToStatus(errdefs.ResourceExhausted("events: this reader fell more than %d events behind", subscriberBuffer))
			}
			if err := srv.Send(eventToProto(e)); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func (a *adminService) agentToProto(ag agent.Agent) *adminv1.Agent {
	p := &adminv1.Agent{
		Id: ag.ID, Name: ag.Name, Strategy: string(ag.Strategy), Command: ag.Command, Env: ag.Env,
		Workspace: ag.Workspace, SharedWorkspace: ag.SharedWorkspace,
		AllowedDomains: ag.AllowedDomains, DeniedDomains: ag.DeniedDomains, NestedSandbox: ag.NestedSandbox,
		Resources: &adminv1.Resources{
			Cpus: uint32(ag.Resources.CPUs), MemoryMib: uint32(ag.Resources.MemoryMiB),
			DiskGib: uint32(ag.Resources.DiskGiB), Pids: uint32(ag.Resources.Pids),
		},
		CreatedAt: timestamppb.New(ag.CreatedAt),
		Dir:       a.s.store.AgentDir(ag.ID),
	}
	for _, m := range ag.Mounts {
		p.Mounts = append(p.Mounts, &adminv1.Mount{Source: m.Source, Target: m.Target, Readonly: m.ReadOnly})
	}
	for _, b := range ag.Secrets {
		p.Secrets = append(p.Secrets, &adminv1.SecretBinding{Env: b.Env, Secret: b.Secret})
	}
	p.AllowCredentials = ag.AllowCredentials
	if l := ag.Login; l != nil {
		p.Login = &adminv1.Login{Runtime: l.Runtime, File: l.File, Template: l.Template}
	}
	p.Runtime, p.RuntimeArgs = ag.Runtime, ag.RuntimeArgs
	p.Warm, p.WarmReady = uint32(ag.Warm), uint32(a.s.warmReady(ag.ID))
	p.Offered, p.NotOffered = a.s.offered(ag)
	return p
}

func agentFromProto(p *adminv1.Agent) agent.Agent {
	ag := agent.Agent{
		Name: p.Name, Strategy: strategy.Name(p.Strategy), Command: p.Command, Env: p.Env,
		Workspace: p.Workspace, SharedWorkspace: p.SharedWorkspace,
		AllowedDomains: p.AllowedDomains, DeniedDomains: p.DeniedDomains, NestedSandbox: p.NestedSandbox,
	}
	if r := p.Resources; r != nil {
		ag.Resources = agent.Resources{CPUs: int(r.Cpus), MemoryMiB: int(r.MemoryMib), DiskGiB: int(r.DiskGib), Pids: int(r.Pids)}
	}
	for _, m := range p.Mounts {
		ag.Mounts = append(ag.Mounts, agent.Mount{Source: m.Source, Target: m.Target, ReadOnly: m.Readonly})
	}
	for _, b := range p.Secrets {
		ag.Secrets = append(ag.Secrets, agent.SecretBinding{Env: b.Env, Secret: b.Secret})
	}
	ag.AllowCredentials = p.AllowCredentials
	if l := p.Login; l != nil {
		ag.Login = &agent.Login{Runtime: l.Runtime, File: l.File, Template: l.Template}
	}
	ag.Runtime, ag.RuntimeArgs = p.Runtime, p.RuntimeArgs
	ag.Warm = int(p.Warm)
	return ag
}

func sessionToProto(v view) *adminv1.Session {
	p := &adminv1.Session{
		Id: v.ID, Agent: v.Agent, AgentId: v.AgentID, Strategy: string(v.Strategy), State: v.State,
		Pid: uint32(v.PID), ExitCode: int32(v.ExitCode), Reason: v.Reason, Run: v.Run,
		CreatedAt: timestamppb.New(v.CreatedAt), OutputBytes: uint64(v.OutputBytes), Command: v.Command,
		ShimPid: uint32(v.ShimPID), Cgroup: v.Cgroup, Limits: v.Limits, NativeSandbox: v.NativeSandbox, RunAs: v.RunAs,
		Workspace: v.Workspace,
	}
	if !v.StartedAt.IsZero() {
		p.StartedAt = timestamppb.New(v.StartedAt)
	}
	if !v.ExitedAt.IsZero() {
		p.ExitedAt = timestamppb.New(v.ExitedAt)
	}
	return p
}

func eventToProto(e event) *adminv1.Event {
	return &adminv1.Event{
		Time: timestamppb.New(e.Time), Type: e.Type, SessionId: e.SessionID, Agent: e.Agent,
		Message: e.Message, ExitCode: int32(e.ExitCode),
	}
}
