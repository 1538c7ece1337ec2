package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/supervisor/secret"
)

func newSecretCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Keep API keys and tokens for agents, outside every boundary",
		Long: `A secret is a value and the hosts allowed to receive it, kept in the daemon's home
(0600, never in logs, events or session files). Bind it to an agent's variable with
agent create|edit --secret ENV_VAR=NAME: on host the variable holds the value; inside
srt and microsandbox it holds a placeholder made for the session, and only requests
to the secret's hosts carry the real value.`,
	}
	cmd.AddCommand(newSecretSetCommand(g), newSecretListCommand(g), newSecretRemoveCommand(g))
	return cmd
}

func newSecretSetCommand(g *globals) *cobra.Command {
	var (
		hosts, headers, tokenHosts   []string
		preset, fromFile, tokenField string
		asJSON                       bool
	)
	cmd := &cobra.Command{
		Use:   "set NAME --host HOST[:PORT]... [--header HEADER]... [--preset P] [--from-file F]",
		Short: "Add or replace a secret; its value comes from stdin or --from-file, never from the command line",
		Long: `Add or replace a secret. The value is read from --from-file, or from stdin (typed
without echo when stdin is a terminal); one trailing newline is dropped. Running
sessions keep the value they started with.

Presets name a service's usual hosts and headers: ` + strings.Join(secret.PresetNames(), ", ") + `.
--host and --header add to a preset's.`,
		Example: `  agentconnect secret set claude --preset anthropic < ~/.anthropic-key
  agentconnect secret set gitea --host git.example.com:3000 --header authorization --from-file token.txt`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			value, err := readSecretValue(cmd.InOrStdin(), cmd.ErrOrStderr(), fromFile)
			if err != nil {
				return err
			}
			req := &adminv1.SetSecretRequest{Name: args[0], Value: value, Hosts: hosts, Headers: headers, Preset: preset,
				TokenHosts: tokenHosts, TokenField: tokenField}
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.Secret, error) {
				return c.SetSecret(ctx, req)
			}, func(s *adminv1.Secret) any { return secretView(s) }, func(w io.Writer, s *adminv1.Secret) {
				fmt.Fprintf(w, "secret %s: for %s\n", s.Name, strings.Join(append(s.Hosts, s.TokenHosts...), ", "))
			})
		},
	}
	cmd.Flags().StringArrayVar(&hosts, "host", nil, "a host that may receive the value: name, *.name or IP, with an optional :port (repeatable)")
	cmd.Flags().StringArrayVar(&headers, "header", nil, "a request header the value may travel in (default: any; repeatable)")
	cmd.Flags().StringVar(&preset, "preset", "", "a service's usual hosts and headers: "+strings.Join(secret.PresetNames(), ", "))
	cmd.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file instead of stdin")
	cmd.Flags().StringArrayVar(&tokenHosts, "token-host", nil, "an OAuth token endpoint's host that renews the value: the placeholder goes to it in request bodies too (repeatable; with --token-field)")
	cmd.Flags().StringVar(&tokenField, "token-field", "", "the field of the token endpoint's answer that holds the next value: "+strings.Join(secret.TokenFields, ", "))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the secret (never its value) as JSON")
	return cmd
}

// readSecretValue reads the value from path, or from stdin: without echo
// from a terminal. One trailing newline is dropped.
func readSecretValue(stdin io.Reader, prompt io.Writer, path string) (string, error) {
	var data []byte
	var err error
	switch f, isFile := stdin.(*os.File); {
	case path != "":
		data, err = os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("--from-file: %w", err)
		}
	case isFile && term.IsTerminal(int(f.Fd())):
		fmt.Fprint(prompt, "value (not shown): ")
		data, err = term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", fmt.Errorf("read the value from the terminal: %w", err)
		}
	default:
		data, err = io.ReadAll(io.LimitReader(stdin, secret.MaxValue+2))
		if err != nil {
			return "", fmt.Errorf("read the value from stdin: %w", err)
		}
	}
	data = bytes.TrimSuffix(data, []byte("\n"))
	data = bytes.TrimSuffix(data, []byte("\r"))
	if len(data) == 0 {
		return "", fmt.Errorf("no value: give it on stdin (agentconnect secret set NAME ... < FILE) or with --from-file")
	}
	return string(data), nil
}

func newSecretListCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List secrets: names, hosts, headers and the agents bound to them, never values",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, asJSON, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.ListSecretsResponse, error) {
				return c.ListSecrets(ctx, &adminv1.ListSecretsRequest{})
			}, func(resp *adminv1.ListSecretsResponse) any {
				out := []secretJSON{}
				for _, s := range resp.Secrets {
					out = append(out, secretView(s))
				}
				return out
			}, func(w io.Writer, resp *adminv1.ListSecretsResponse) {
				rows := [][]string{{"NAME", "HOSTS", "HEADERS", "AGENTS"}}
				for _, s := range resp.Secrets {
					hdrs := strings.Join(s.Headers, ",")
					if hdrs == "" {
						hdrs = "any"
					}
					hosts := slices.Clone(s.Hosts)
					for _, h := range s.TokenHosts {
						hosts = append(hosts, h+" (renews its "+s.TokenField+")")
					}
					rows = append(rows, []string{s.Name, strings.Join(hosts, ","), hdrs, strings.Join(s.Agents, ",")})
				}
				table(w, rows)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSecretRemoveCommand(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"remove"},
		Short:   "Remove a secret (refused while an agent is bound to it, unless --force)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return callAndPrint(cmd, g, false, func(ctx context.Context, c adminv1.AdminClient) (*adminv1.RemoveSecretResponse, error) {
				return c.RemoveSecret(ctx, &adminv1.RemoveSecretRequest{Name: args[0], Force: force})
			}, nil, func(w io.Writer, _ *adminv1.RemoveSecretResponse) { fmt.Fprintf(w, "secret %s removed\n", args[0]) })
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove it even while agents are bound to it (their sessions refuse to start until it is set again)")
	return cmd
}
