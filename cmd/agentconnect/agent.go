package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

func newAgentCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Define, list, change and remove agents",
	}
	cmd.AddCommand(newAgentCreateCommand(g), newAgentListCommand(g), newAgentShowCommand(g),
		newAgentEditCommand(g), newAgentRemoveCommand(g), newAgentLoginCommand(g))
	return cmd
}

// agentFlags are the settings create and edit share.
type agentFlags struct {
	strategy        string
	runtime         string
	workspace       string
	sharedWorkspace string
	mounts          []string
	env             []string
	envFile         string
	secrets         []string
	credentials     []string
	allowDomains    []string
	denyDomains     []string
	nestedSandbox   bool
	cpus            int
	memoryMiB       int
	diskGiB         int
	pids            int
	warm            int
	asJSON          bool
}

func (f *agentFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.strategy, "strategy", "", "execution strategy: host, srt or microsandbox (default: host where it can run, else the first available sandbox)")
	fs.StringVar(&f.runtime, "runtime", "", "run a known ACP runtime from the daemon's runtime cache ("+strings.Join(runtimes.Names(), ", ")+"), installed if it is not; the arguments after -- are added to its own; \"\" goes back to a command")
	fs.StringVar(&f.workspace, "workspace", "", "the workspace, a directory inside the agent directory (default \"workspace\")")
	fs.StringVar(&f.sharedWorkspace, "shared-workspace", "", "use this host directory as the workspace, declared as shared")
	fs.StringArrayVar(&f.mounts, "mount", nil, "share a host path: SRC:DST[:ro|rw] or type=bind,src=S,dst=D[,readonly] (read-only unless rw; repeatable)")
	fs.StringArrayVar(&f.env, "env", nil, "set K=V, or K to take its value from this shell (repeatable)")
	fs.StringVar(&f.envFile, "env-file", "", "read K=V lines from a file (# comments, blank lines ignored)")
	fs.StringArrayVar(&f.credentials, "allow-credential", nil, "show a credential file of the daemon's user that a mount or the shared workspace holds, absent otherwise inside srt and microsandbox: ssh, aws, gh, netrc, docker, git-credentials, gcloud, kube (repeatable)")
	fs.StringArrayVar(&f.secrets, "secret", nil, "bind ENV_VAR=SECRET from the secrets store (secret set): the value on host, a placeholder of the session inside srt and microsandbox (repeatable)")
	fs.StringArrayVar(&f.allowDomains, "allow-domain", nil, "allow network access to a domain (example.com, *.example.com, host:port; repeatable)")
	fs.StringArrayVar(&f.denyDomains, "deny-domain", nil, "deny network access to a domain (wins over allow; repeatable)")
	fs.BoolVar(&f.nestedSandbox, "nested-sandbox", false, "srt: let the runtime start its own sandbox inside (bwrap); off by default")
	fs.IntVar(&f.cpus, "cpus", 0, "cpus: a cgroup limit for host and srt sessions, the VM size for microsandbox")
	fs.IntVar(&f.memoryMiB, "memory-mib", 0, "memory in MiB: a cgroup limit for host and srt sessions, the VM size for microsandbox")
	fs.IntVar(&f.diskGiB, "disk-gib", 0, "microsandbox: capacity of each writable VM disk in GiB")
	fs.IntVar(&f.pids, "pids", 0, "the session's process limit (default 4096 where cgroups are available)")
	fs.IntVar(&f.warm, "warm", 0, fmt.Sprintf("keep N boundaries built ahead (0 to %d; a microsandbox one is a booted VM, memoryMiB each): a session claims one and binds its command, env and secrets then", agent.MaxWarm))
	fs.BoolVar(&f.asJSON, "json", false, "print the agent as JSON")
}

// apply sets the fields of a whose flags were given.
func (f *agentFlags) apply(fs *pflag.FlagSet, a *adminv1.Agent) error {
	changed := fs.Changed
	if changed("strategy") {
		a.Strategy = f.strategy
	}
	if changed("runtime") {
		a.Runtime = f.runtime
		if f.runtime != "" {
			a.Command = nil
		} else {
			a.RuntimeArgs = nil
		}
	}
	if changed("workspace") {
		a.Workspace, a.SharedWorkspace = f.workspace, ""
	}
	if changed("shared-workspace") {
		a.SharedWorkspace, a.Workspace = f.sharedWorkspace, ""
	}
	if changed("mount") {
		a.Mounts = nil
		for _, s := range f.mounts {
			m, err := agent.ParseMount(s)
			if err != nil {
				return err
			}
			a.Mounts = append(a.Mounts, &adminv1.Mount{Source: m.Source, Target: m.Target, Readonly: m.ReadOnly})
		}
	}
	if changed("env") || changed("env-file") {
		var env []string
		if f.envFile != "" {
			fileEnv, err := readEnvFile(f.envFile)
			if err != nil {
				return err
			}
			env = append(env, fileEnv...)
		}
		for _, kv := range f.env {
			env = append(env, expandEnv(kv))
		}
		a.Env = env
	}
	if changed("allow-credential") {
		a.AllowCredentials = f.credentials
	}
	if changed("secret") {
		a.Secrets = nil
		for _, s := range f.secrets {
			b, err := agent.ParseSecretBinding(s)
			if err != nil {
				return err
			}
			a.Secrets = append(a.Secrets, &adminv1.SecretBinding{Env: b.Env, Secret: b.Secret})
		}
	}
	if changed("allow-domain") {
		a.AllowedDomains = f.allowDomains
	}
	if changed("deny-domain") {
		a.DeniedDomains = f.denyDomains
	}
	if changed("nested-sandbox") {
		a.NestedSandbox = f.nestedSandbox
	}
	if changed("warm") {
		if f.warm < 0 {
			return fmt.Errorf("--warm %d: want 0 to %d", f.warm, agent.MaxWarm)
		}
		a.Warm = uint32(f.warm)
	}
	if a.Resources == nil {
		a.Resources = &adminv1.Resources{}
	}
	for _, r := range []struct {
		flag string
		v    int
		dst  *uint32
	}{{"cpus", f.cpus, &a.Resources.Cpus}, {"memory-mib", f.memoryMiB, &a.Resources.MemoryMib},
		{"disk-gib", f.diskGiB, &a.Resources.DiskGib}, {"pids", f.pids, &a.Resources.Pids}} {
		if changed(r.flag) {
			if r.v < 0 {
				return fmt.Errorf("--%s %d: want 0 or more", r.flag, r.v)
			}
			*r.dst = uint32(r.v)
		}
	}
	return nil
}

// expandEnv turns a bare K into K=<its value here>, as docker run -e does.
func expandEnv(kv string) string {
	if strings.Contains(kv, "=") {
		return kv
	}
	return kv + "=" + os.Getenv(kv)
}

func readEnvFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--env-file: %w", err)
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		env = append(env, expandEnv(line))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--env-file %s: %w", path, err)
	}
	return env, nil
}

// splitDash splits args at "--": before it the positionals, after it a command.
func splitDash(cmd *cobra.Command, args []string) (positional, command []string) {
	if at := cmd.ArgsLenAtDash(); at >= 0 {
		return args[:at], args[at:]
	}
	return args, nil
}

// setCommand puts what followed -- in a: a known runtime's extra
// arguments, or the command itself.
func setCommand(a *adminv1.Agent, command []string) {
	switch {
	case len(command) == 0:
	case a.Runtime != "":
		a.RuntimeArgs = command
	default:
		a.Command = command
	}
}

func newAgentCreateCommand(g *globals) *cobra.Command {
	f := &agentFlags{}
	var fromFile string
	cmd := &cobra.Command{
		Use:   "create NAME [flags] (--runtime NAME [-- EXTRA-ARG...] | -- CMD [ARG...])",
		Short: "Define an agent: a runtime and the boundary its sessions run in",
		Long: `Define an agent: its runtime and the execution strategy its sessions run in,
with its workspace, environment, mounts, network policy and limits.

The runtime is a known ACP runtime (--runtime claude|codex|gemini|opencode), or any
ACP command after --. A known runtime runs from the daemon's runtime cache at the
version this release pins (installed now if it is not: runtime ls shows the
cache), read-only inside srt and microsandbox; its model API's hosts are added to
the allowed domains, and the arguments after -- are added to its own.

The agent gets a directory in the daemon home with workspace/, home/ (the
runtime's private HOME), memory/ and tmp/ (its private TMPDIR). --workspace names
a directory inside it; a workspace elsewhere must be declared with
--shared-workspace. --from-file reads the settings from an agent.json; flags
override it.`,
		Example: `  agentconnect agent create claude --runtime claude --secret ANTHROPIC_API_KEY=anthropic
  agentconnect agent create codex --strategy microsandbox --runtime codex
  agentconnect agent create other --allow-domain api.example.com -- my-acp-runtime --stdio
  agentconnect agent create tools --mount /opt/tools:/opt/tools --env-file ./agent.env -- my-acp-runtime`,
		RunE: func(cmd *cobra.Command, args []string) error {
			positional, command := splitDash(cmd, args)
			a := &adminv1.Agent{}
			if fromFile != "" {
				var err error
				if a, err = readAgentFile(fromFile); err != nil {
					return err
				}
			}
			switch len(positional) {
			case 0:
				if a.Name == "" {
					return fmt.Errorf("give the agent a NAME")
				}
			case 1:
				a.Name = positional[0]
			default:
				return fmt.Errorf("too many arguments before --: %q (put the runtime command after --)", positional[1:])
			}
			if err := f.apply(cmd.Flags(), a); err != nil {
				return err
			}
			setCommand(a, command)
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			created, err := c.admin.CreateAgent(cmd.Context(), &adminv1.CreateAgentRequest{Agent: a})
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), agentView(created))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s created (strategy %s, directory %s)\n", created.Name, created.Strategy, created.Dir)
			return nil
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().StringVar(&fromFile, "from-file", "", "read the agent from an agent.json (flags override it)")
	return cmd
}

// readAgentFile reads an agent.json: the same keys as `agent show --json`.
func readAgentFile(path string) (*adminv1.Agent, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--from-file: %w", err)
	}
	var v agentJSON
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("--from-file %s: %w", path, err)
	}
	if v.Warm < 0 || v.Warm > agent.MaxWarm {
		return nil, fmt.Errorf("--from-file %s: warm %d: want 0 to %d", path, v.Warm, agent.MaxWarm)
	}
	a := &adminv1.Agent{
		Name: v.Name, Strategy: v.Strategy, Command: v.Command, Runtime: v.Runtime, RuntimeArgs: v.RuntimeArgs, Env: v.Env, Workspace: v.Workspace,
		SharedWorkspace: v.SharedWorkspace, AllowedDomains: v.AllowedDomains, DeniedDomains: v.DeniedDomains,
		NestedSandbox: v.NestedSandbox, Warm: uint32(v.Warm),
		Resources: &adminv1.Resources{Cpus: uint32(v.Resources.CPUs), MemoryMib: uint32(v.Resources.MemoryMiB),
			DiskGib: uint32(v.Resources.DiskGiB), Pids: uint32(v.Resources.Pids)},
	}
	for _, m := range v.Mounts {
		a.Mounts = append(a.Mounts, &adminv1.Mount{Source: m.Source, Target: m.Target, Readonly: m.ReadOnly})
	}
	return a, nil
}

func newAgentListCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List agents",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.ListAgentsResponse, error) {
				return c.ListAgents(ctx, &adminv1.ListAgentsRequest{})
			}, func(resp *adminv1.ListAgentsResponse) any {
				out := []agentJSON{}
				for _, a := range resp.Agents {
					out = append(out, agentView(a))
				}
				return out
			}, func(w io.Writer, resp *adminv1.ListAgentsResponse) {
				rows := [][]string{{"NAME", "STRATEGY", "COMMAND", "WORKSPACE"}}
				for _, a := range resp.Agents {
					strat := a.Strategy
					switch {
					case a.Offered:
					case strings.HasPrefix(a.NotOffered, "Not offered"):
						strat += " (not offered)"
					default:
						strat += " (refused)"
					}
					ws := a.Workspace
					if a.SharedWorkspace != "" {
						ws = a.SharedWorkspace + " (shared)"
					}
					command := strings.Join(a.Command, " ")
					if a.Runtime != "" {
						command = strings.TrimSpace("runtime " + a.Runtime + " " + strings.Join(a.RuntimeArgs, " "))
					}
					rows = append(rows, []string{a.Name, strat, command, ws})
				}
				table(w, rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newAgentShowCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show NAME",
		Short: "Show an agent",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.Agent, error) {
				return c.GetAgent(ctx, &adminv1.GetAgentRequest{Name: args[0]})
			}, func(a *adminv1.Agent) any { return agentView(a) }, printAgent)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printAgent(w io.Writer, a *adminv1.Agent) {
	fmt.Fprintf(w, "name:       %s\nid:         %s\n", a.Name, a.Id)
	if a.Offered {
		fmt.Fprintf(w, "strategy:   %s\n", a.Strategy)
	} else {
		fmt.Fprintf(w, "strategy:   %s  %s\n", a.Strategy, a.NotOffered)
	}
	if a.Runtime != "" {
		fmt.Fprintf(w, "runtime:    %s\n", strings.TrimSpace(a.Runtime+" "+strings.Join(a.RuntimeArgs, " ")))
	} else {
		fmt.Fprintf(w, "command:    %s\n", strings.Join(a.Command, " "))
	}
	if a.SharedWorkspace != "" {
		fmt.Fprintf(w, "workspace:  %s (shared)\n", a.SharedWorkspace)
	} else {
		fmt.Fprintf(w, "workspace:  %s/%s\n", a.Dir, a.Workspace)
	}
	fmt.Fprintf(w, "directory:  %s\n", a.Dir)
	for _, kv := range a.Env {
		k, _, _ := strings.Cut(kv, "=")
		fmt.Fprintf(w, "env:        %s=…\n", k)
	}
	for _, b := range a.Secrets {
		// On host there is no boundary to keep the value out of.
		where := "a placeholder inside the boundary; the real value only on the wire to the secret's hosts"
		if a.Strategy == "host" {
			where = "the real value: host has no boundary"
		}
		fmt.Fprintf(w, "secret:     %s from %s (%s)\n", b.Env, b.Secret, where)
	}
	if l := a.Login; l != nil {
		where := "placeholders inside the boundary; the real tokens only on the wire, renewed through the proxy"
		if a.Strategy == "host" {
			where = "the real tokens: host has no boundary"
		}
		fmt.Fprintf(w, "login:      %s, ~/%s from %s (%s)\n", l.Runtime, l.File,
			strings.Join(loginSecrets(l), ", "), where)
	}
	if len(a.AllowCredentials) > 0 {
		fmt.Fprintf(w, "credentials: %s shown where a mount holds them (every other one is absent inside)\n", strings.Join(a.AllowCredentials, ", "))
	}
	for _, m := range a.Mounts {
		mode := "ro"
		if !m.Readonly {
			mode = "rw"
		}
		fmt.Fprintf(w, "mount:      %s -> %s (%s)\n", m.Source, m.Target, mode)
	}
	if len(a.AllowedDomains) > 0 {
		fmt.Fprintf(w, "allow:      %s\n", strings.Join(a.AllowedDomains, ", "))
	}
	if len(a.DeniedDomains) > 0 {
		fmt.Fprintf(w, "deny:       %s\n", strings.Join(a.DeniedDomains, ", "))
	}
	if a.NestedSandbox {
		fmt.Fprintln(w, "nested sandbox: on")
	}
	if a.Warm > 0 {
		fmt.Fprintf(w, "warm:       %d boundaries built ahead, %d ready\n", a.Warm, a.WarmReady)
	}
	if r := a.Resources; r != nil && (r.Cpus|r.MemoryMib|r.DiskGib|r.Pids) != 0 {
		fmt.Fprintf(w, "resources:  cpus %d, memory %d MiB, disk %d GiB, pids %d\n", r.Cpus, r.MemoryMib, r.DiskGib, r.Pids)
	}
}

func newAgentEditCommand(g *globals) *cobra.Command {
	f := &agentFlags{}
	var rename string
	cmd := &cobra.Command{
		Use:   "edit NAME [flags] [-- CMD [ARG...]]",
		Short: "Change an agent's settings",
		Long: `Change the settings given as flags (and the command, when given after --: for an
agent of a known runtime, its extra arguments); the others stay. A list flag (--mount, --env, --allow-domain, --deny-domain) replaces
the whole list. Running sessions keep the settings they started with.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			positional, command := splitDash(cmd, args)
			if len(positional) != 1 {
				return fmt.Errorf("give the NAME of the agent to edit")
			}
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			a, err := c.admin.GetAgent(cmd.Context(), &adminv1.GetAgentRequest{Name: positional[0]})
			if err != nil {
				return err
			}
			if rename != "" {
				a.Name = rename
			}
			if err := f.apply(cmd.Flags(), a); err != nil {
				return err
			}
			setCommand(a, command)
			updated, err := c.admin.UpdateAgent(cmd.Context(), &adminv1.UpdateAgentRequest{Name: positional[0], Agent: a})
			if err != nil {
				return err
			}
			if f.asJSON {
				return printJSON(cmd.OutOrStdout(), agentView(updated))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s updated\n", updated.Name)
			return nil
		},
	}
	f.register(cmd.Flags())
	cmd.Flags().StringVar(&rename, "name", "", "rename the agent")
	return cmd
}

func newAgentRemoveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"remove"},
		Short:   "Remove an agent, its directory and its sessions",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.admin.DeleteAgent(cmd.Context(), &adminv1.DeleteAgentRequest{Name: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s removed\n", args[0])
			return nil
		},
	}
}
