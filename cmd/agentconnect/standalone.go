package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/supervisor"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// standaloneFlags describe the one agent of a standalone chat.
type standaloneFlags struct {
	on           bool
	runtime      string
	workspace    string
	allowDomains []string
	env          []string
}

func addStandaloneFlags(cmd *cobra.Command, f *standaloneFlags) {
	cmd.Flags().BoolVar(&f.on, "standalone", false, "no daemon: run the runtime in an srt sandbox of the chat's own (with --runtime)")
	cmd.Flags().StringVar(&f.runtime, "runtime", "", "--standalone: the known runtime `NAME` ("+strings.Join(runtimes.Names(), ", ")+")")
	cmd.Flags().StringVar(&f.workspace, "workspace", "", "--standalone: the `DIR` the runtime works in, writable (default: the current directory)")
	cmd.Flags().StringArrayVar(&f.allowDomains, "allow-domain", nil, "--standalone: a `DOMAIN` the sandbox may reach besides the runtime's API (repeatable)")
	cmd.Flags().StringArrayVar(&f.env, "env", nil, "--standalone: a `KEY=VALUE` of the runtime's environment, or KEY to pass this one's (repeatable; the value is inside the sandbox: a daemon's secrets keep keys out)")
}

// standaloneAgent is the name of a standalone chat's agent.
const standaloneAgent = "chat"

// runStandaloneChat runs a private daemon in a temporary home (srt only),
// makes the agent the flags describe, chats with it, and removes it all.
func runStandaloneChat(cmd *cobra.Command, _ *globals, f chatFlags, args []string) error {
	sf := f.standalone
	switch {
	case f.session != "":
		return errors.New("--session attaches through a daemon; a standalone chat's session ends with it")
	case f.keep:
		return errors.New("--keep needs a daemon: a standalone chat's sandbox ends with it")
	case len(args) > 1:
		return errors.New("a standalone chat takes only a PROMPT: its agent is --runtime in --workspace")
	case sf.runtime == "":
		return fmt.Errorf("give --runtime NAME with --standalone (one of %s); for microsandbox, or any other command, use a daemon's agent", strings.Join(runtimes.Names(), ", "))
	}
	if _, ok := runtimes.Known[sf.runtime]; !ok {
		return fmt.Errorf("unknown runtime %q: known runtimes are %s", sf.runtime, strings.Join(runtimes.Names(), ", "))
	}
	prompt := ""
	if len(args) == 1 {
		prompt = args[0]
	}
	ws := sf.workspace
	if ws == "" {
		ws = "."
	}
	ws, err := filepath.Abs(ws)
	if err != nil {
		return err
	}
	env, err := standaloneEnv(sf.env)
	if err != nil {
		return err
	}
	shim, err := findShim("agentconnect-shim")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "agentconnect-chat-")
	if err != nil {
		return fmt.Errorf("standalone chat: a private home: %w", err)
	}
	defer os.RemoveAll(dir)
	layout := home.Layout{Root: dir}
	if err := layout.Create(); err != nil {
		return err
	}
	lock, err := layout.Lock()
	if err != nil {
		return err
	}
	defer lock.Close()
	logFile, err := os.OpenFile(filepath.Join(dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	log := logrus.New()
	log.SetOutput(logFile)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	ran := make(chan error, 1)
	go func() {
		_, err := supervisor.Run(ctx, supervisor.Options{Home: dir, ShimBinary: shim, Lock: lock, Log: log,
			Args: os.Args, Ready: func() { close(ready) }})
		ran <- err
	}()
	select {
	case <-ready:
	case err := <-ran:
		return fmt.Errorf("standalone chat: the private daemon: %w", err)
	}
	defer func() {
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
		}
	}()

	g := &globals{home: dir}
	c, err := g.connect(ctx)
	if err != nil {
		return err
	}
	_, err = c.admin.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: &adminv1.Agent{
		Name: standaloneAgent, Strategy: "srt", Runtime: sf.runtime, SharedWorkspace: ws,
		AllowedDomains: sf.allowDomains, Env: env,
	}})
	c.Close()
	if err != nil {
		return fmt.Errorf("standalone chat: %s", message(err))
	}
	return chatThroughDaemon(cmd, g, f, standaloneAgent, prompt)
}

// standaloneEnv is --env: KEY=VALUE as given, KEY with this process's value.
func standaloneEnv(given []string) ([]string, error) {
	var env []string
	for _, kv := range given {
		if strings.Contains(kv, "=") {
			env = append(env, kv)
			continue
		}
		v, ok := os.LookupEnv(kv)
		if !ok {
			return nil, fmt.Errorf("--env %s: this shell has no %s to pass (give --env %s=VALUE)", kv, kv, kv)
		}
		env = append(env, kv+"="+v)
	}
	sort.Strings(env)
	return env, nil
}
