// Package session defines the files of a session directory, which the
// supervisor and the session's shim both read: session.json (what to run),
// bootstrap.json (where the shim listens), status.json (how the run is going
// or how it ended), output.log and violations.json (the refused
// connections).
package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// The ports of the session's proxy inside srt, on the sandbox's loopback
// (HTTP_PROXY and ALL_PROXY point there).
const (
	SRTHTTPProxyPort  = 3128
	SRTSOCKSProxyPort = 1080
)

// States of a session, as users see them.
const (
	Running = "running"
	Exited  = "exited"
	Lost    = "lost"
)

// Record is session.json, written by the supervisor before each run.
type Record struct {
	ID        string        `json:"id"`
	AgentID   string        `json:"agentId"`
	Agent     string        `json:"agent"`
	Strategy  strategy.Name `json:"strategy"`
	CreatedAt time.Time     `json:"createdAt"`
	// Run counts the runs: 1 for the first, one more for each resume.
	Run  uint32 `json:"run"`
	Spec Spec   `json:"spec"`
	// Warm marks a warm boundary that no session has claimed yet: its shim
	// prepares the run from Spec and waits; the supervisor that claims it
	// rewrites the record with the session's own command and env (and
	// Warm false) before Start. Users never see one.
	Warm bool `json:"warm,omitempty"`
}

// Spec is what a shim runs.
type Spec struct {
	Strategy strategy.Name `json:"strategy"`
	Command  []string      `json:"command"`
	// CommandOverride is set when the command is not the agent's own (exec).
	CommandOverride bool `json:"commandOverride,omitempty"`
	// Env is the runtime's whole environment: nothing else is inherited.
	Env       []string `json:"env"`
	Workspace string   `json:"workspace"`
	Home      string   `json:"home"`
	Tmp       string   `json:"tmp"`
	Memory    string   `json:"memory"`
	// Cgroup lists the directories of the session's cgroup, made by the
	// supervisor; empty when sessions run without cgroups.
	Cgroup []string `json:"cgroup"`
	Limits Limits   `json:"limits"`
	// LimitsNote says what limits apply, or why none do, for status.
	LimitsNote string `json:"limitsNote"`
	// NativeSandbox says whether a known runtime's own tool sandbox runs
	// inside the boundary ("on: ...") or why not ("off: ..."); empty for
	// other runtimes.
	NativeSandbox string `json:"nativeSandbox,omitempty"`
	// OutputLimitMiB bounds output.log: the run that reaches it is stopped
	// (0, from an older supervisor, means DefaultOutputLimitMiB).
	OutputLimitMiB int64 `json:"outputLimitMiB"`
	// RunAs is the account a host session's runtime runs as (the daemon's
	// sandbox.host.user under a root daemon); nil: the shim's own.
	RunAs *RunAs `json:"runAs,omitempty"`
	// Sandbox is the srt boundary's settings; nil for host sessions.
	Sandbox *Sandbox `json:"sandbox,omitempty"`
	// VM is the microsandbox VM's settings; nil for other sessions. Its
	// network policy is Sandbox's (AllowedDomains, DeniedDomains, Resolver).
	VM *VM `json:"vm,omitempty"`
}

// RunAs is an account a runtime runs as, resolved by the supervisor.
type RunAs struct {
	Name   string   `json:"name"`
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups"`
}

// Sandbox is what the shim needs to build an srt boundary.
type Sandbox struct {
	DaemonHome      string   `json:"daemonHome"`
	Hidden          []string `json:"hidden"` // the daemon user's home, other users' homes
	AgentDir        string   `json:"agentDir"`
	SharedWorkspace bool     `json:"sharedWorkspace"`
	Mounts          []Mount  `json:"mounts"`
	AllowedDomains  []string `json:"allowedDomains"`
	DeniedDomains   []string `json:"deniedDomains"`
	NestedSandbox   bool     `json:"nestedSandbox"`
	// Resolver is the DNS server the policy proxy asks ("IP:port"); empty
	// for the system's.
	Resolver string `json:"resolver"`
	// TrustedCAPEM verifies, besides the system's store, the hosts the
	// proxy sends secrets to (config trustedCAFile).
	TrustedCAPEM string `json:"trustedCAPEM,omitempty"`
	// Credentials are the daemon user's credential files (resolved host
	// paths) that must be absent inside, wherever a mount or the shared
	// workspace would show them.
	Credentials []string `json:"credentials,omitempty"`
}

// Mount shares a host path into a boundary.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readonly"`
}

// MaxViolationKinds bounds the kinds of refusal (protocol, host, port,
// reason) a session's violations.json keeps: refusals of a new kind beyond
// it are counted, not kept.
const MaxViolationKinds = 256

// Violations is violations.json: the refusals of a session's runs, one
// entry per kind, written by the shim atomically (a few times a second at
// most, and at the end of each run). Its size is bounded whatever the
// session does: MaxViolationKinds entries of bounded fields.
type Violations struct {
	// Total counts every refusal, those not kept included.
	Total uint64 `json:"total"`
	// Dropped counts the refusals of a new kind once MaxViolationKinds
	// kinds were kept.
	Dropped uint64 `json:"dropped"`
	// Imported is how many entries were folded in from the violations.jsonl
	// of an earlier version: their events were sent then.
	Imported int `json:"imported"`
	// Entries are the kinds, in the order they were first seen.
	Entries []ViolationEntry `json:"entries"`
}

// ViolationEntry is one kind of refusal.
type ViolationEntry struct {
	// Violation is the latest refusal of the kind: Time is when it was
	// last seen.
	netpolicy.Violation
	Count uint64    `json:"count"`
	First time.Time `json:"first"`
}

// ViolationsReported is violations-reported.json, the supervisor's own:
// how many entries of violations.json it has sent as events, so that a
// restarted supervisor neither repeats nor skips any.
type ViolationsReported struct {
	Entries int `json:"entries"`
}

// DefaultOutputLimitMiB is a session's output limit when config.json sets
// none.
const DefaultOutputLimitMiB = 1024

// OutputLimit is the output limit of s's session, in MiB.
func (s Spec) OutputLimit() (mib int64) {
	if s.OutputLimitMiB > 0 {
		return s.OutputLimitMiB
	}
	return DefaultOutputLimitMiB
}

// Limits are applied through the session's cgroup.
type Limits struct {
	Pids      int64 `json:"pids"`
	MemoryMiB int64 `json:"memoryMiB"`
	CPUs      int   `json:"cpus"`
}

// Bootstrap is bootstrap.json, written by the shim once it listens.
type Bootstrap struct {
	Address    string `json:"address"`
	PID        int    `json:"pid"`
	StartTime  uint64 `json:"startTime"` // with PID, identifies the shim process
	APIVersion uint32 `json:"apiVersion"`
	Version    string `json:"version"`
	Run        uint32 `json:"run"`
}

// Status is status.json: written by the shim when the runtime starts and
// when it has exited, or by the supervisor when the shim was lost.
type Status struct {
	Run          uint32    `json:"run"`
	State        string    `json:"state"`
	PID          int       `json:"pid"`
	PIDStartTime uint64    `json:"pidStartTime"`
	ExitCode     int       `json:"exitCode"`
	Reason       string    `json:"reason"`
	StartedAt    time.Time `json:"startedAt"`
	ExitedAt     time.Time `json:"exitedAt"`
}

// Dir names the files of one session directory.
type Dir string

func (d Dir) RecordPath() string     { return filepath.Join(string(d), "session.json") }
func (d Dir) BootstrapPath() string  { return filepath.Join(string(d), "bootstrap.json") }
func (d Dir) StatusPath() string     { return filepath.Join(string(d), "status.json") }
func (d Dir) OutputPath() string     { return filepath.Join(string(d), "output.log") }
func (d Dir) ShimLogPath() string    { return filepath.Join(string(d), "shim.log") }
func (d Dir) ViolationsPath() string { return filepath.Join(string(d), "violations.json") }

// LegacyViolationsPath is the unbounded log of refusals earlier versions
// appended to; the next run's shim folds it into violations.json.
func (d Dir) LegacyViolationsPath() string { return filepath.Join(string(d), "violations.jsonl") }

// ViolationsReportedPath is violations-reported.json.
func (d Dir) ViolationsReportedPath() string {
	return filepath.Join(string(d), "violations-reported.json")
}

// ReadRecord reads session.json.
func (d Dir) ReadRecord() (*Record, error) {
	var r Record
	if err := atomicfile.ReadJSON(d.RecordPath(), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// WriteRecord writes session.json atomically.
func (d Dir) WriteRecord(r *Record) error { return atomicfile.WriteJSON(d.RecordPath(), r, 0o600) }

// WriteRecordUnsynced writes session.json atomically but not durably, until
// SyncRecord: for a record that a power loss meanwhile could only take with
// the start that writes it (a new session's, a warm boundary's claim).
func (d Dir) WriteRecordUnsynced(r *Record) error {
	return atomicfile.WriteVolatileJSON(d.RecordPath(), r, 0o600)
}

// SyncRecord makes what WriteRecordUnsynced wrote durable.
func (d Dir) SyncRecord() error { return atomicfile.Sync(d.RecordPath()) }

// ReadBootstrap reads bootstrap.json; (nil, nil) when there is none.
func (d Dir) ReadBootstrap() (*Bootstrap, error) {
	var b Bootstrap
	if err := atomicfile.ReadJSON(d.BootstrapPath(), &b); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	return &b, nil
}

// WriteBootstrap writes bootstrap.json atomically. It describes a live
// process, so it is not fsynced: after a power loss there is no shim to find.
func (d Dir) WriteBootstrap(b *Bootstrap) error {
	return atomicfile.WriteVolatileJSON(d.BootstrapPath(), b, 0o600)
}

// ReadStatus reads status.json; (nil, nil) when there is none.
func (d Dir) ReadStatus() (*Status, error) {
	var s Status
	if err := atomicfile.ReadJSON(d.StatusPath(), &s); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	return &s, nil
}

// WriteStatus writes status.json atomically. How a run ended is made durable;
// that it is running is not (it is not true after a power loss anyway).
func (d Dir) WriteStatus(s *Status) error {
	if s.State == Running {
		return atomicfile.WriteVolatileJSON(d.StatusPath(), s, 0o600)
	}
	return atomicfile.WriteJSON(d.StatusPath(), s, 0o600)
}

// ReadViolations reads violations.json; empty when there is none.
func (d Dir) ReadViolations() (*Violations, error) {
	var v Violations
	if err := atomicfile.ReadJSON(d.ViolationsPath(), &v); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return &Violations{}, err
	}
	return &v, nil
}

// WriteViolations writes violations.json atomically; durable fsyncs it, for
// the last write of a run.
func (d Dir) WriteViolations(v *Violations, durable bool) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// Hosts come from the session: no <, > or & turned into six bytes each.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write %s: %w", d.ViolationsPath(), err)
	}
	if durable {
		return atomicfile.WriteFile(d.ViolationsPath(), buf.Bytes(), 0o600)
	}
	return atomicfile.WriteVolatile(d.ViolationsPath(), buf.Bytes(), 0o600)
}

// MergeEnv returns base with over's variables set: a variable keeps its
// first position, and the last value given wins.
func MergeEnv(base, over []string) []string {
	all := append(append([]string(nil), base...), over...)
	index := map[string]int{}
	var env []string
	for _, kv := range all {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			env[i] = kv
			continue
		}
		index[k] = len(env)
		env = append(env, kv)
	}
	return env
}
