package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/config"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/supervisor/probe"
)

// exitNoDaemon is status's exit code when no daemon answers.
const exitNoDaemon = 3

func newStatusCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the daemon, its strategies and its sessions",
		Long: `Show the daemon: its version and pid, each execution strategy (available, or the
reason it is not), cgroup limits, and session counts.

With no daemon answering, status prints why the last start failed, if it did,
and exits 3.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, err := g.connect(ctx)
			if err != nil {
				return noDaemonStatus(g, cmd.OutOrStdout(), err, asJSON)
			}
			defer c.Close()
			st, err := c.admin.Status(ctx, &adminv1.StatusRequest{})
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), statusView(st))
			}
			printStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func noDaemonStatus(g *globals, w io.Writer, dialErr error, asJSON bool) error {
	layout, err := g.layout()
	if err != nil {
		return err
	}
	failure := ""
	if data, err := os.ReadFile(layout.StartupFailurePath()); err == nil {
		failure = strings.TrimSpace(string(data))
	}
	if asJSON {
		printJSON(w, map[string]any{"daemon": "not running", "home": layout.Root, "lastStartupFailure": failure})
		return &exitError{code: exitNoDaemon}
	}
	fmt.Fprintf(w, "daemon: not running on %s\n", layout.Root)
	if failure != "" {
		fmt.Fprintf(w, "last startup failure:\n  %s\n", strings.ReplaceAll(failure, "\n", "\n  "))
	}
	return &exitError{code: exitNoDaemon, err: dialErr}
}

func printStatus(w io.Writer, st *adminv1.StatusResponse) {
	fmt.Fprintf(w, "daemon:      running, pid %d, version %s, since %s\n", st.Pid, st.Version, ago(st.StartedAt))
	fmt.Fprintf(w, "home:        %s\n", st.Home)
	if st.SystemdUnit != "" {
		fmt.Fprintf(w, "systemd:     %s\n", st.SystemdUnit)
	}
	if st.ConfigPath != "" {
		fmt.Fprintf(w, "config:      %s\n", st.ConfigPath)
	}
	fmt.Fprintln(w, "strategies:")
	for _, s := range st.Strategies {
		fmt.Fprintf(w, "  %s\n", strategyLine(strategyJSON{Name: s.Name, Available: s.Available, Reason: s.Reason, Detail: s.Detail}))
	}
	if st.DefaultStrategy != "" {
		fmt.Fprintf(w, "new agents:  %s\n", st.DefaultStrategy)
	}
	if c := st.Cgroups; c != nil {
		if c.Available {
			fmt.Fprintf(w, "limits:      per-session cgroups (%s)\n", c.Mode)
		} else {
			fmt.Fprintf(w, "limits:      none, sessions run unlimited: %s\n", c.Reason)
		}
	}
	fmt.Fprintf(w, "sessions:    %d (%d running)\n", st.Sessions, st.Running)
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "warning:     %s\n", warn)
	}
}

func newProbeCommand(g *globals) *cobra.Command {
	var asJSON, requireSandbox bool
	var configPath string
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Check which execution strategies can run here, without a daemon",
		Long: `Run the startup check of every execution strategy the config offers, as the
daemon does, and print each one as available or with the reason it is not.
Exits 0 when at least one strategy is available, 1 otherwise. It installs and
downloads nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			layout, err := g.layout()
			if err != nil {
				return err
			}
			path, explicit := configPath, configPath != ""
			if !explicit {
				path = layout.ConfigPath()
			}
			cfg, err := config.Load(path, explicit)
			if err != nil {
				return err
			}
			for _, w := range cfg.Warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			if requireSandbox {
				cfg.RequireSandbox("--require-sandbox turns host off on this daemon")
			}
			// Without these the microsandbox check says so.
			vmShim, _ := findShim("agentconnect-shim-vm")
			vmImage, _ := findShim("agentconnect-vmimage")
			results := probe.Run(cfg, probe.Env{ImageDir: findImageDir(), VMShimBinary: vmShim, VMImageBinary: vmImage, Home: layout.Root})
			if asJSON {
				out := []strategyJSON{}
				for _, r := range results {
					out = append(out, strategyJSON{Name: string(r.Name), Available: r.Available, Reason: r.Reason, Detail: r.Detail})
				}
				printJSON(cmd.OutOrStdout(), out)
			} else {
				for _, r := range results {
					fmt.Fprintln(cmd.OutOrStdout(), strategyLine(strategyJSON{Name: string(r.Name), Available: r.Available, Reason: r.Reason, Detail: r.Detail}))
				}
			}
			if !probe.AnyAvailable(results) {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&configPath, "config", "", "the config file (default <home>/config.json)")
	cmd.Flags().BoolVar(&requireSandbox, "require-sandbox", false, "check as a daemon run with --require-sandbox")
	return cmd
}

// lifecycleTimeout bounds waiting for a restart or a stop to take effect.
const lifecycleTimeout = 30 * time.Second

func newRestartCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "restart",
		Short: "Restart the daemon; sessions keep running",
		Long: `Restart the daemon. Under systemd this is systemctl restart of its unit;
a foreground daemon re-executes itself with the arguments it was started with
(--require-sandbox included). Sessions keep running and the new daemon adopts
them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return lifecycle(cmd.Context(), g, cmd.OutOrStdout(), "restart", syscall.SIGHUP)
		},
	}
}

func newStopCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stop",
		Short: "Stop the daemon; sessions keep running",
		Long: `Stop the daemon. Under systemd this is systemctl stop of its unit; a
foreground daemon gets SIGTERM. Sessions keep running in their shims; the next
daemon on this home adopts them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return lifecycle(cmd.Context(), g, cmd.OutOrStdout(), "stop", syscall.SIGTERM)
		},
	}
}

func lifecycle(ctx context.Context, g *globals, w io.Writer, verb string, sig syscall.Signal) error {
	c, err := g.connect(ctx)
	if err != nil {
		return err
	}
	st, err := c.admin.Status(ctx, &adminv1.StatusRequest{})
	c.Close()
	if err != nil {
		return err
	}
	if st.SystemdUnit != "" && underSystemd() {
		args := []string{verb, st.SystemdUnit}
		if st.SystemdUser {
			args = append([]string{"--user"}, args...)
		}
		out, err := exec.CommandContext(ctx, "systemctl", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("systemctl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		fmt.Fprintf(w, "%s: systemctl %s done\n", st.SystemdUnit, verb)
		return nil
	}
	pid := int(st.Pid)
	startTime, err := procstat.StartTime(pid)
	if err != nil {
		return fmt.Errorf("daemon pid %d: %w", pid, err)
	}
	if err := procstat.Signal(pid, startTime, sig); err != nil {
		return fmt.Errorf("signal daemon (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(lifecycleTimeout)
	for time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if verb == "stop" {
			if !procstat.Alive(pid, startTime) {
				fmt.Fprintf(w, "daemon (pid %d) stopped; sessions keep running\n", pid)
				return nil
			}
			continue
		}
		// A restart is done when the same pid answers with a new start time.
		c, err := g.connect(ctx)
		if err != nil {
			continue
		}
		st2, err := c.admin.Status(ctx, &adminv1.StatusRequest{})
		c.Close()
		if err == nil && st2.StartedAt.AsTime().After(st.StartedAt.AsTime()) {
			fmt.Fprintf(w, "daemon (pid %d) restarted\n", st2.Pid)
			return nil
		}
	}
	return errors.New("the daemon did not " + verb + " within " + lifecycleTimeout.String() + "; see its log")
}

// underSystemd reports whether systemd is the init system here.
func underSystemd() bool {
	fi, err := os.Stat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// strategyLine is one strategy in status and probe: "srt  available", or
// unavailable with the reason; how it runs, when the probe says.
func strategyLine(s strategyJSON) string {
	state := "available"
	if !s.Available {
		state = "unavailable"
	}
	if s.Detail != "" {
		state += " (" + s.Detail + ")"
	}
	if !s.Available {
		state += ": " + s.Reason
	}
	return fmt.Sprintf("%-13s %s", s.Name, state)
}
