package main

import (
	"github.com/spf13/cobra"

	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/version"
)

// globals are the flags every command takes.
type globals struct {
	home     string
	instance string
	socket   string
}

// layout resolves the home the flags name.
func (g *globals) layout() (home.Layout, error) {
	dir, err := home.Resolve(g.home, g.instance)
	if err != nil {
		return home.Layout{}, err
	}
	return home.Layout{Root: dir}, nil
}

// socketPath is --socket, or the admin socket of the home.
func (g *globals) socketPath() (string, error) {
	if g.socket != "" {
		return g.socket, nil
	}
	l, err := g.layout()
	if err != nil {
		return "", err
	}
	return l.AdminSocket(), nil
}

func newRootCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "agentconnect",
		Short: "Run AI coding-agent sessions inside an execution strategy",
		Long: `agentconnect runs AI coding-agent sessions (Claude Code, Codex, any ACP runtime)
inside the execution strategy chosen for each agent: host (no boundary), srt (an
OS sandbox) or microsandbox (a microVM per session).

"agentconnect run" is the daemon. Every other command talks to it through its
admin socket, found from the home: --home, $AGENTCONNECT_HOME, --instance NAME
(~/.agentconnect/instances/NAME) or ~/.agentconnect.`,
		Version:       version.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.home, "home", "", "the daemon's home directory (default $AGENTCONNECT_HOME or ~/.agentconnect)")
	pf.StringVar(&g.instance, "instance", "", "a named daemon instance: its home is ~/.agentconnect/instances/NAME")
	pf.StringVar(&g.socket, "socket", "", "the admin socket (default: found from the home)")
	root.AddCommand(
		newRunCommand(g),
		newStatusCommand(g),
		newProbeCommand(g),
		newRestartCommand(g),
		newStopCommand(g),
		newAgentCommand(g),
		newSecretCommand(g),
		newRuntimeCommand(g),
		newSessionCommand(g),
		newExecCommand(g),
		newChatCommand(g),
		newEventsCommand(g),
	)
	return root
}
