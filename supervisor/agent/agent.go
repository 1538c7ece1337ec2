// Package agent defines an agent (a runtime command and the boundary its
// sessions run in), checks its settings, and stores it in the daemon home.
package agent

import (
	"time"

	"github.com/agentconnect-md/agentconnect/strategy"
)

// Agent is what agent.json holds.
type Agent struct {
	ID       string        `json:"id"`
	Name     string        `json:"name"`
	Strategy strategy.Name `json:"strategy"`
	// Command is the runtime to run, unless Runtime names a known one.
	Command []string `json:"command"`
	// Runtime is a known ACP runtime (runtime ls) run from the daemon's
	// runtime cache, with RuntimeArgs after its own arguments.
	Runtime     string   `json:"runtime,omitempty"`
	RuntimeArgs []string `json:"runtimeArgs,omitempty"`
	Env         []string `json:"env"` // KEY=VALUE
	// Secrets bind variables to secrets of the daemon's store: the value on
	// host, a placeholder of the session inside srt and microsandbox.
	Secrets []SecretBinding `json:"secrets"`
	// AllowCredentials opts credential files of the daemon's user back in
	// (Credentials' names) where a mount or the shared workspace would
	// show them; every other one is absent inside srt and microsandbox.
	AllowCredentials []string `json:"allowCredentials"`
	// Login is a runtime's login (agent login), if it has one.
	Login *Login `json:"login,omitempty"`
	// Workspace is a path relative to the agent directory.
	Workspace string `json:"workspace"`
	// SharedWorkspace is a host directory declared as shared; when set it is
	// the workspace.
	SharedWorkspace string    `json:"sharedWorkspace"`
	Mounts          []Mount   `json:"mounts"`
	AllowedDomains  []string  `json:"allowedDomains"`
	DeniedDomains   []string  `json:"deniedDomains"`
	NestedSandbox   bool      `json:"nestedSandbox"`
	Resources       Resources `json:"resources"`
	// Warm is how many boundaries (a host process, an srt sandbox, a booted
	// microsandbox VM) the daemon keeps built ahead for the agent's
	// sessions: a session claims one and binds its command, env and secrets
	// then (see the supervisor's warm pool).
	Warm      int       `json:"warm,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// RunInSandbox is the setting of agents made before strategies existed.
	// It is mapped to Strategy once, and then dropped.
	RunInSandbox *bool `json:"runInSandbox,omitempty"`
}

// Credentials are the daemon user's usual credential files, by the name an
// agent opts one back in with, relative to that user's home.
var Credentials = map[string]string{
	"ssh":             ".ssh",
	"aws":             ".aws",
	"gh":              ".config/gh",
	"netrc":           ".netrc",
	"docker":          ".docker/config.json",
	"git-credentials": ".git-credentials",
	"gcloud":          ".config/gcloud",
	"kube":            ".kube",
}

// Login is a runtime's credentials file, written into the agent's home for
// each run: Template with each {{SECRET}} (a secret's name) replaced by the
// run's placeholder for it (on host: its value). It holds no value.
type Login struct {
	Runtime  string `json:"runtime"`
	File     string `json:"file"` // relative to the agent's home
	Template string `json:"template"`
}

// SecretBinding sets the variable Env from the secret named Secret.
type SecretBinding struct {
	Env    string `json:"env"`
	Secret string `json:"secret"`
}

// Mount shares a host path into the agent's boundary.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readonly"`
}

// Resources are the agent's limits: cgroup limits for host and srt sessions,
// the VM's size for microsandbox ones. Zero means the default.
type Resources struct {
	CPUs      int `json:"cpus"`
	MemoryMiB int `json:"memoryMiB"`
	DiskGiB   int `json:"diskGiB"`
	Pids      int `json:"pids"`
}

// AsksForLimits reports whether the agent set a cgroup limit itself: such an
// agent is refused where limits cannot be applied, rather than run without.
func (r Resources) AsksForLimits() bool {
	return r.CPUs > 0 || r.MemoryMiB > 0 || r.Pids > 0
}

// DefaultWorkspace is the workspace of an agent that names none.
const DefaultWorkspace = "workspace"

// The directories every agent has beside its workspace.
const (
	HomeDir   = "home"   // the runtime's private HOME
	MemoryDir = "memory" // memory the runtime keeps between sessions
	TmpDir    = "tmp"    // the runtime's private TMPDIR
	File      = "agent.json"
)
