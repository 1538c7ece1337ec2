package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
)

// The JSON views: camelCase keys, every field present, integers as numbers,
// lists never null, times as RFC 3339 or "".

type strategyJSON struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason"`
	Detail    string `json:"detail"`
}

type cgroupsJSON struct {
	Available bool   `json:"available"`
	Mode      string `json:"mode"`
	Reason    string `json:"reason"`
}

type statusJSON struct {
	Daemon          string         `json:"daemon"`
	Version         string         `json:"version"`
	PID             int            `json:"pid"`
	Home            string         `json:"home"`
	StartedAt       string         `json:"startedAt"`
	Strategies      []strategyJSON `json:"strategies"`
	DefaultStrategy string         `json:"defaultStrategy"`
	RequireSandbox  bool           `json:"requireSandbox"`
	Cgroups         cgroupsJSON    `json:"cgroups"`
	ConfigPath      string         `json:"configPath"`
	Warnings        []string       `json:"warnings"`
	SystemdUnit     string         `json:"systemdUnit"`
	Sessions        int            `json:"sessions"`
	RunningSessions int            `json:"runningSessions"`
	Args            []string       `json:"args"`
}

type mountJSON struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readonly"`
}

type resourcesJSON struct {
	CPUs      int `json:"cpus"`
	MemoryMiB int `json:"memoryMiB"`
	DiskGiB   int `json:"diskGiB"`
	Pids      int `json:"pids"`
}

type agentJSON struct {
	ID               string        `json:"id"`
	Name             string        `json:"name"`
	Strategy         string        `json:"strategy"`
	Offered          bool          `json:"offered"`
	NotOffered       string        `json:"notOffered"`
	Command          []string      `json:"command"`
	Runtime          string        `json:"runtime"`
	RuntimeArgs      []string      `json:"runtimeArgs"`
	Env              []string      `json:"env"`
	Secrets          []bindingJSON `json:"secrets"`
	AllowCredentials []string      `json:"allowCredentials"`
	// Login is the runtime's login (agent login), null without one.
	Login           *loginJSON    `json:"login"`
	Workspace       string        `json:"workspace"`
	SharedWorkspace string        `json:"sharedWorkspace"`
	Mounts          []mountJSON   `json:"mounts"`
	AllowedDomains  []string      `json:"allowedDomains"`
	DeniedDomains   []string      `json:"deniedDomains"`
	NestedSandbox   bool          `json:"nestedSandbox"`
	Resources       resourcesJSON `json:"resources"`
	Warm            int           `json:"warm"`
	// WarmReady is set by the daemon: how many warm boundaries are ready.
	WarmReady int    `json:"warmReady"`
	CreatedAt string `json:"createdAt"`
	Dir       string `json:"dir"`
}

type loginJSON struct {
	Runtime string   `json:"runtime"`
	File    string   `json:"file"`
	Secrets []string `json:"secrets"`
}

// loginSecrets are the secrets a login's template holds.
func loginSecrets(l *adminv1.Login) []string {
	return (&agent.Login{Template: l.Template}).LoginSecrets()
}

type bindingJSON struct {
	Env    string `json:"env"`
	Secret string `json:"secret"`
}

type secretJSON struct {
	Name    string   `json:"name"`
	Hosts   []string `json:"hosts"`
	Headers []string `json:"headers"`
	Preset  string   `json:"preset"`
	Agents  []string `json:"agents"`
	// TokenHosts and TokenField renew the value (an OAuth token endpoint).
	TokenHosts []string `json:"tokenHosts"`
	TokenField string   `json:"tokenField"`
	CreatedAt  string   `json:"createdAt"`
	UpdatedAt  string   `json:"updatedAt"`
}

func secretView(s *adminv1.Secret) secretJSON {
	return secretJSON{
		Name: s.Name, Hosts: list(s.Hosts), Headers: list(s.Headers), Preset: s.Preset, Agents: list(s.Agents),
		TokenHosts: list(s.TokenHosts), TokenField: s.TokenField,
		CreatedAt: timeString(s.CreatedAt), UpdatedAt: timeString(s.UpdatedAt),
	}
}

type sessionJSON struct {
	ID          string   `json:"id"`
	Agent       string   `json:"agent"`
	AgentID     string   `json:"agentId"`
	Strategy    string   `json:"strategy"`
	State       string   `json:"state"`
	PID         int      `json:"pid"`
	ExitCode    int      `json:"exitCode"`
	Reason      string   `json:"reason"`
	Run         int      `json:"run"`
	CreatedAt   string   `json:"createdAt"`
	StartedAt   string   `json:"startedAt"`
	ExitedAt    string   `json:"exitedAt"`
	OutputBytes int64    `json:"outputBytes"`
	Command     []string `json:"command"`
	ShimPID     int      `json:"shimPid"`
	Cgroup      string   `json:"cgroup"`
	Limits      string   `json:"limits"`
	// NativeSandbox is a known runtime's own tool sandbox: "on: ..." or
	// "off: <why>"; empty for other runtimes.
	NativeSandbox string `json:"nativeSandbox"`
	// Workspace is the runtime's working directory, as it sees it.
	Workspace string `json:"workspace"`
	// RunAs is the account a host session runs as when it is not the
	// daemon's (sandbox.host.user): "NAME (uid N)".
	RunAs string    `json:"runAs"`
	Usage usageJSON `json:"usage"`
	// ViolationCount, Violations and ViolationsNotKept (`session show`):
	// connections the network policy refused, every one counted; one
	// entry per kind kept, the latest seen last; refusals of kinds beyond
	// those kept.
	ViolationCount    int64           `json:"violationCount"`
	Violations        []violationJSON `json:"violations"`
	ViolationsNotKept int64           `json:"violationsNotKept"`
}

// violationJSON is a kind of refusal: Time is the latest one.
type violationJSON struct {
	Time      string `json:"time"`
	Protocol  string `json:"protocol"`
	Host      string `json:"host"`
	Port      int    `json:"port"`
	Addr      string `json:"addr"`
	Reason    string `json:"reason"`
	Count     int64  `json:"count"`
	FirstTime string `json:"firstTime"`
}

// usageJSON is a running session's cgroup counters (zero otherwise).
type usageJSON struct {
	MemoryBytes uint64 `json:"memoryBytes"`
	Pids        uint64 `json:"pids"`
	CPUUsageNs  uint64 `json:"cpuUsageNs"`
}

type eventJSON struct {
	Time      string `json:"time"`
	Type      string `json:"type"`
	SessionID string `json:"sessionId"`
	Agent     string `json:"agent"`
	Message   string `json:"message"`
	ExitCode  int    `json:"exitCode"`
}

func timeString(ts *timestamppb.Timestamp) string {
	if ts == nil || (ts.Seconds == 0 && ts.Nanos == 0) {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

func list[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func statusView(s *adminv1.StatusResponse) statusJSON {
	v := statusJSON{
		Daemon: "running", Version: s.Version, PID: int(s.Pid), Home: s.Home, StartedAt: timeString(s.StartedAt),
		Strategies: []strategyJSON{}, DefaultStrategy: s.DefaultStrategy, RequireSandbox: s.RequireSandbox,
		ConfigPath: s.ConfigPath, Warnings: list(s.Warnings), SystemdUnit: s.SystemdUnit,
		Sessions: int(s.Sessions), RunningSessions: int(s.Running), Args: list(s.Args),
	}
	for _, st := range s.Strategies {
		v.Strategies = append(v.Strategies, strategyJSON{Name: st.Name, Available: st.Available, Reason: st.Reason, Detail: st.Detail})
	}
	if c := s.Cgroups; c != nil {
		v.Cgroups = cgroupsJSON{Available: c.Available, Mode: c.Mode, Reason: c.Reason}
	}
	return v
}

func agentView(a *adminv1.Agent) agentJSON {
	v := agentJSON{
		ID: a.Id, Name: a.Name, Strategy: a.Strategy, Offered: a.Offered, NotOffered: a.NotOffered,
		Command: list(a.Command), Runtime: a.Runtime, RuntimeArgs: list(a.RuntimeArgs), Env: list(a.Env), Workspace: a.Workspace, SharedWorkspace: a.SharedWorkspace,
		Mounts: []mountJSON{}, AllowedDomains: list(a.AllowedDomains), DeniedDomains: list(a.DeniedDomains),
		NestedSandbox: a.NestedSandbox, Warm: int(a.Warm), WarmReady: int(a.WarmReady), CreatedAt: timeString(a.CreatedAt), Dir: a.Dir, Secrets: []bindingJSON{}, AllowCredentials: list(a.AllowCredentials),
	}
	for _, b := range a.Secrets {
		v.Secrets = append(v.Secrets, bindingJSON{Env: b.Env, Secret: b.Secret})
	}
	if l := a.Login; l != nil {
		v.Login = &loginJSON{Runtime: l.Runtime, File: l.File, Secrets: list(loginSecrets(l))}
	}
	for _, m := range a.Mounts {
		v.Mounts = append(v.Mounts, mountJSON{Source: m.Source, Target: m.Target, ReadOnly: m.Readonly})
	}
	if r := a.Resources; r != nil {
		v.Resources = resourcesJSON{CPUs: int(r.Cpus), MemoryMiB: int(r.MemoryMib), DiskGiB: int(r.DiskGib), Pids: int(r.Pids)}
	}
	return v
}

func sessionView(s *adminv1.Session) sessionJSON {
	v := sessionJSON{
		ID: s.Id, Agent: s.Agent, AgentID: s.AgentId, Strategy: s.Strategy, State: s.State,
		PID: int(s.Pid), ExitCode: int(s.ExitCode), Reason: s.Reason, Run: int(s.Run),
		CreatedAt: timeString(s.CreatedAt), StartedAt: timeString(s.StartedAt), ExitedAt: timeString(s.ExitedAt),
		OutputBytes: int64(s.OutputBytes), Command: list(s.Command), ShimPID: int(s.ShimPid),
		Cgroup: s.Cgroup, Limits: s.Limits, NativeSandbox: s.NativeSandbox, Workspace: s.Workspace, RunAs: s.RunAs,
	}
	if u := s.Usage; u != nil {
		v.Usage = usageJSON{MemoryBytes: u.MemoryBytes, Pids: u.Pids, CPUUsageNs: u.CpuUsageNs}
	}
	v.ViolationCount, v.ViolationsNotKept = int64(s.ViolationCount), int64(s.ViolationsNotKept)
	v.Violations = []violationJSON{}
	for _, x := range s.Violations {
		v.Violations = append(v.Violations, violationJSON{Time: timeString(x.Time), Protocol: x.Protocol, Host: x.Host, Port: int(x.Port),
			Addr: x.Addr, Reason: x.Reason, Count: int64(x.Count), FirstTime: timeString(x.FirstTime)})
	}
	return v
}

func eventView(e *adminv1.Event) eventJSON {
	return eventJSON{
		Time: timeString(e.Time), Type: e.Type, SessionID: e.SessionId, Agent: e.Agent,
		Message: e.Message, ExitCode: int(e.ExitCode),
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table writes aligned columns; the first row is the header.
func table(w io.Writer, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// ago is a short age, for tables.
func ago(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	d := time.Since(ts.AsTime())
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

func printJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
