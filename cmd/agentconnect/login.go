package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/supervisor/secret"
)

// loginProfile is how a known runtime logs in: its own login command, the
// credentials file it writes (relative to HOME), and the tokens in it.
type loginProfile struct {
	command    []string
	file       string
	apiHosts   []string // where the access token is sent (Authorization)
	tokenHosts []string // the OAuth token endpoint that renews the tokens
	tokens     []loginToken
}

// loginToken is a token of a credentials file: where it is in the JSON,
// the suffix of the secret that keeps it, the field of a token answer that
// renews it, and whether the runtime sends it to the API hosts.
type loginToken struct {
	path   []string
	suffix string
	field  string
	api    bool
}

// loginProfiles are the runtimes agent login knows. Codex's id_token stays
// as it is: Codex reads its claims, and it opens no API.
var loginProfiles = map[string]loginProfile{
	"claude": {
		command: []string{"claude", "auth", "login"}, file: ".claude/.credentials.json",
		apiHosts: []string{"api.anthropic.com"}, tokenHosts: []string{"platform.claude.com", "console.anthropic.com"},
		tokens: []loginToken{
			{path: []string{"claudeAiOauth", "accessToken"}, suffix: "access", field: "access_token", api: true},
			{path: []string{"claudeAiOauth", "refreshToken"}, suffix: "refresh", field: "refresh_token"},
		},
	},
	"codex": {
		command: []string{"codex", "login"}, file: ".codex/auth.json",
		apiHosts: []string{"chatgpt.com", "api.openai.com"}, tokenHosts: []string{"auth.openai.com"},
		tokens: []loginToken{
			{path: []string{"tokens", "access_token"}, suffix: "access", field: "access_token", api: true},
			{path: []string{"tokens", "refresh_token"}, suffix: "refresh", field: "refresh_token"},
		},
	},
}

func loginRuntimes() string {
	names := make([]string, 0, len(loginProfiles))
	for n := range loginProfiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func newAgentLoginCommand(g *globals) *cobra.Command {
	var (
		runtime, fromFile    string
		apiHosts, tokenHosts []string
	)
	cmd := &cobra.Command{
		Use:   "login AGENT [--runtime claude|codex] [--from-file FILE]",
		Short: "Log an agent's runtime in, keeping its tokens in the secrets store",
		Long: `Run the runtime's own login (Claude Code: claude auth login; Codex: codex login) on
this host as the daemon's user, in this terminal, with a HOME of its own, and keep
the tokens of the credentials file it writes in the secrets store (secrets
AGENT-RUNTIME-access and AGENT-RUNTIME-refresh). --from-file takes an existing
credentials file instead (~/.claude/.credentials.json, ~/.codex/auth.json).

Each run of the agent finds that file in its home: inside srt and microsandbox with
placeholders for the tokens, on host with the tokens. When the runtime refreshes its
login, the session's proxy sends the token endpoint the real refresh token, keeps
the new tokens in the store, and gives the runtime placeholders again: no real
token enters the boundary, and the next session starts with the new ones.`,
		Example: `  agentconnect agent login claude
  agentconnect agent login codex --runtime codex --from-file ~/.codex/auth.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer c.Close()
			a, err := c.admin.GetAgent(cmd.Context(), &adminv1.GetAgentRequest{Name: args[0]})
			if err != nil {
				return err
			}
			if runtime == "" {
				runtime = a.Runtime
			}
			if runtime == "" {
				runtime = guessRuntime(a.Command)
			}
			p, ok := loginProfiles[runtime]
			if !ok {
				return fmt.Errorf("agent %s: say which runtime to log in with --runtime (%s)", a.Name, loginRuntimes())
			}
			if len(apiHosts) > 0 {
				p.apiHosts = apiHosts
			}
			if len(tokenHosts) > 0 {
				p.tokenHosts = tokenHosts
			}
			data, err := credentialsFile(cmd, p, fromFile)
			if err != nil {
				return err
			}
			template, secrets, err := p.split(a.Name, runtime, data)
			if err != nil {
				return err
			}
			for _, s := range secrets {
				if _, err := c.admin.SetSecret(cmd.Context(), s); err != nil {
					return err
				}
			}
			a.Login = &adminv1.Login{Runtime: runtime, File: p.file, Template: template}
			if _, err := c.admin.UpdateAgent(cmd.Context(), &adminv1.UpdateAgentRequest{Name: a.Name, Agent: a}); err != nil {
				return err
			}
			names := make([]string, len(secrets))
			for i, s := range secrets {
				names[i] = s.Name
			}
			fmt.Fprintf(cmd.OutOrStdout(), "agent %s: logged in with %s; its tokens are secrets %s, its runs find ~/%s\n",
				a.Name, runtime, strings.Join(names, ", "), p.file)
			return nil
		},
	}
	cmd.Flags().StringVar(&runtime, "runtime", "", "the runtime: "+loginRuntimes()+" (default: from the agent's command)")
	cmd.Flags().StringVar(&fromFile, "from-file", "", "take this credentials file instead of running the runtime's login")
	cmd.Flags().StringArrayVar(&apiHosts, "api-host", nil, "where the access token may go, instead of the runtime's API hosts (repeatable; a gateway)")
	cmd.Flags().StringArrayVar(&tokenHosts, "token-host", nil, "the OAuth token endpoint's host, instead of the runtime's (repeatable)")
	return cmd
}

// guessRuntime names the known runtime an agent's command runs, if any.
func guessRuntime(command []string) string {
	for _, arg := range command {
		for _, name := range []string{"claude", "codex"} {
			if strings.Contains(filepath.Base(arg), name) || strings.Contains(arg, "/"+name) {
				return name
			}
		}
	}
	return ""
}

// credentialsFile is the file given, or the one the runtime's own login
// writes into a HOME of its own (removed after).
func credentialsFile(cmd *cobra.Command, p loginProfile, fromFile string) ([]byte, error) {
	if fromFile != "" {
		data, err := os.ReadFile(fromFile)
		if err != nil {
			return nil, fmt.Errorf("--from-file: %w", err)
		}
		return data, nil
	}
	path, err := exec.LookPath(p.command[0])
	if err != nil {
		return nil, fmt.Errorf("%s is not installed for the daemon's user: install it, or give its credentials file with --from-file", p.command[0])
	}
	home, err := os.MkdirTemp("", "agentconnect-login-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	login := exec.CommandContext(cmd.Context(), path, p.command[1:]...)
	login.Env = append(os.Environ(), "HOME="+home)
	login.Stdin, login.Stdout, login.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
	if err := login.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(p.command, " "), err)
	}
	data, err := os.ReadFile(filepath.Join(home, p.file))
	if err != nil {
		return nil, fmt.Errorf("%s ended without writing ~/%s: %w", strings.Join(p.command, " "), p.file, err)
	}
	return data, nil
}

// split takes the tokens out of a credentials file: the file with each one
// replaced by {{SECRET}}, and the secrets that keep them.
func (p loginProfile) split(agentName, runtime string, data []byte) (string, []*adminv1.SetSecretRequest, error) {
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber() // an expiry in milliseconds stays as written
	if err := dec.Decode(&doc); err != nil || doc == nil {
		return "", nil, errors.New("the credentials file is not a JSON object") // the decoder's message could quote a token
	}
	var secrets []*adminv1.SetSecretRequest
	for _, t := range p.tokens {
		obj := doc
		for _, k := range t.path[:len(t.path)-1] {
			next, ok := obj[k].(map[string]any)
			if !ok {
				obj = nil
				break
			}
			obj = next
		}
		key := t.path[len(t.path)-1]
		value, _ := obj[key].(string)
		if value == "" {
			return "", nil, fmt.Errorf("the credentials file has no %s: is it %s's ~/%s, after a login?", strings.Join(t.path, "."), runtime, p.file)
		}
		name := agentName + "-" + runtime + "-" + t.suffix
		if err := secret.ValidateName(name); err != nil {
			return "", nil, err
		}
		s := &adminv1.SetSecretRequest{Name: name, Value: value, TokenHosts: p.tokenHosts, TokenField: t.field}
		if t.api {
			s.Hosts, s.Headers = p.apiHosts, []string{"authorization"}
		}
		secrets = append(secrets, s)
		obj[key] = "{{" + name + "}}"
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", nil, err
	}
	if slices.ContainsFunc(secrets, func(s *adminv1.SetSecretRequest) bool { return strings.Contains(string(out), s.Value) }) {
		return "", nil, errors.New("a token of the credentials file appears in it twice: it cannot be kept out of the boundary")
	}
	return string(out) + "\n", secrets, nil
}
