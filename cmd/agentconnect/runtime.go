package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// runtimeInstallTimeout bounds an install: npm fetches the runtime.
const runtimeInstallTimeout = 11 * time.Minute

type runtimeJSON struct {
	Name             string   `json:"name"`
	Package          string   `json:"package"`
	Version          string   `json:"version"`
	Installed        bool     `json:"installed"`
	InstalledVersion string   `json:"installedVersion"`
	Digest           string   `json:"digest"`
	Dir              string   `json:"dir"`
	Command          []string `json:"command"`
	InstalledAt      string   `json:"installedAt"`
}

func runtimeView(r *adminv1.Runtime) runtimeJSON {
	return runtimeJSON{Name: r.Name, Package: r.Package, Version: r.Version, Installed: r.Installed, InstalledVersion: r.InstalledVersion,
		Digest: r.Digest, Dir: r.Dir, Command: list(r.Command), InstalledAt: timeString(r.InstalledAt)}
}

func newRuntimeCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runtime",
		Short: "The daemon's cache of known ACP runtimes (" + strings.Join(runtimes.Names(), ", ") + ")",
		Long: `The known ACP runtimes are npm packages at the versions this release pins. The daemon
installs each one once, outside every boundary, into a tree of its home named by the
digest of its package-lock.json, which every agent of that runtime shares.`,
	}
	cmd.AddCommand(newRuntimeListCommand(g), newRuntimeInstallCommand(g, false), newRuntimeInstallCommand(g, true))
	return cmd
}

func newRuntimeListCommand(g *globals) *cobra.Command {
	var asJSON, known bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the known runtimes: the pinned version, and what the cache holds",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if known {
				return printKnownRuntimes(cmd.OutOrStdout(), asJSON)
			}
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.ListRuntimesResponse, error) {
				return c.ListRuntimes(ctx, &adminv1.ListRuntimesRequest{})
			}, func(resp *adminv1.ListRuntimesResponse) any {
				out := []runtimeJSON{}
				for _, r := range resp.Runtimes {
					out = append(out, runtimeView(r))
				}
				return out
			}, func(w io.Writer, resp *adminv1.ListRuntimesResponse) {
				rows := [][]string{{"NAME", "PACKAGE", "PINNED", "INSTALLED", "DIGEST"}}
				for _, r := range resp.Runtimes {
					installed, digest := "no", ""
					if r.Installed {
						installed, digest = r.InstalledVersion, r.Digest[:12]
					}
					rows = append(rows, []string{r.Name, r.Package, r.Version, installed, digest})
				}
				table(w, rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&known, "known", false, "the runtimes this binary pins, without asking a daemon (what make image installs in the guest image)")
	return cmd
}

// printKnownRuntimes lists runtimes.Known: name, package, pinned version.
func printKnownRuntimes(w io.Writer, asJSON bool) error {
	out := []runtimeJSON{}
	rows := [][]string{{"NAME", "PACKAGE", "PINNED"}}
	for _, n := range runtimes.Names() {
		r := runtimes.Known[n]
		out = append(out, runtimeJSON{Name: r.Name, Package: r.Package, Version: r.Version, Command: r.Command(runtimes.Target(n), nil)})
		rows = append(rows, []string{r.Name, r.Package, r.Version})
	}
	if asJSON {
		return printJSON(w, out)
	}
	table(w, rows)
	return nil
}

func newRuntimeInstallCommand(g *globals, update bool) *cobra.Command {
	var asJSON bool
	use, short := "install NAME", "Install a known runtime into the cache (nothing to do when it is there)"
	if update {
		use, short = "update NAME", "Install a known runtime again, at the version this release pins"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), runtimeInstallTimeout)
			defer cancel()
			cmd.SetContext(ctx)
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.Runtime, error) {
				return c.InstallRuntime(ctx, &adminv1.InstallRuntimeRequest{Name: args[0], Update: update})
			}, func(r *adminv1.Runtime) any { return runtimeView(r) }, func(w io.Writer, r *adminv1.Runtime) {
				fmt.Fprintf(w, "runtime %s: %s@%s in %s\n", r.Name, r.Package, r.InstalledVersion, r.Dir)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the runtime as JSON")
	return cmd
}
