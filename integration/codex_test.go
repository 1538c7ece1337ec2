package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentconnect-md/agentconnect/internal/testtls"
)

// fakeOpenAI is the Responses API, streaming, enough for one tool-using
// turn of Codex: a prompt asking for a file gets an exec_command call that
// writes it; the call's output gets a message and the end of the turn. It
// records the keys it was sent and the tool outputs it got back.
type fakeOpenAI struct {
	cmd     string // the exec_command's command; empty: the default one
	mu      sync.Mutex
	keys    []string
	paths   []string
	outputs []string
}

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.keys = append(f.keys, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	if r.Method != "POST" || r.URL.Path != "/v1/responses" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Input []map[string]any `json:"input"`
	}
	body, _ := io.ReadAll(r.Body)
	json.Unmarshal(body, &req)
	w.Header().Set("Content-Type", "text/event-stream")
	event := func(typ string, v map[string]any) {
		v["type"] = typ
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
		w.(http.Flusher).Flush()
	}
	event("response.created", map[string]any{"response": map[string]any{"id": "resp_1"}})
	var output string
	for _, item := range req.Input {
		if item["type"] == "function_call_output" {
			output = fmt.Sprint(item["output"])
		}
	}
	switch {
	case output != "":
		f.mu.Lock()
		f.outputs = append(f.outputs, output)
		f.mu.Unlock()
		msg := map[string]any{"type": "message", "role": "assistant", "id": "msg_1", "content": []any{}}
		event("response.output_item.added", map[string]any{"output_index": 0, "item": msg})
		event("response.output_text.delta", map[string]any{"output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": "The file is written."})
		msg["content"] = []any{map[string]any{"type": "output_text", "text": "The file is written."}}
		event("response.output_item.done", map[string]any{"output_index": 0, "item": msg})
	case strings.Contains(string(body), "WRITE-THE-FILE"):
		cmd := f.cmd
		if cmd == "" {
			cmd = `printf 'written by codex inside a boundary\n' > hello.txt`
		}
		args, _ := json.Marshal(map[string]any{"cmd": cmd})
		event("response.output_item.done", map[string]any{"output_index": 0, "item": map[string]any{
			"type": "function_call", "id": "fc_1", "name": "exec_command", "arguments": string(args), "call_id": "call_1"}})
	}
	event("response.completed", map[string]any{"response": map[string]any{"id": "resp_1",
		"usage": map[string]any{"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}}})
}

// TestCodexTurnInSRTWithABoundKey: a real Codex (codex-acp from npm, the
// known runtime) completes a tool-using turn inside srt against a fake
// Responses API on the host's loopback: its exec_command tool writes a
// file in the workspace; the API gets the bound key's value, the runtime
// only its placeholder.
func TestCodexTurnInSRTWithABoundKey(t *testing.T) {
	requireBwrap(t)
	codexTurn(t, "srt", "", false)
}

// TestCodexOwnSandboxInNestedSRT: with nestedSandbox under an unprivileged
// daemon, Codex's own sandbox runs inside srt: its tool writes the file in
// the workspace, and is refused a write in /run, which srt alone allows.
// (The test's daemon home is under /tmp, which Codex's workspace-write
// allows as a whole.)
func TestCodexOwnSandboxInNestedSRT(t *testing.T) {
	requireRoot(t) // to make the unprivileged daemon's home
	requireBwrap(t)
	codexTurn(t, "srt", "", true)
}

// TestCodexTurnInMicrosandboxWithABoundKey: the same turn in a VM, where
// Codex's own sandbox runs too (the image has bubblewrap) as the guest's
// unprivileged user: a write the VM alone allows is refused, and so is a
// switch to full-access; the file belongs to the workspace's owner.
func TestCodexTurnInMicrosandboxWithABoundKey(t *testing.T) {
	requireMicrosandbox(t)
	codexTurn(t, "microsandbox", `, "sandbox": {"microsandbox": {"accelerator": "tcg", "transport": "serial", "cpus": 2, "memoryMiB": 1024}}`, false)
}

// TestCodexTurnOnHost: the same turn with no boundary, the key's value in
// the runtime's environment.
func TestCodexTurnOnHost(t *testing.T) {
	codexTurn(t, "host", "", false)
}

// codexTurn runs the turn in strategy with config keys besides
// trustedCAFile; nested: with nestedSandbox, under a daemon running as
// nobody, where Codex's own sandbox runs too.
func codexTurn(t *testing.T, strategy, config string, nested bool) {
	requireNPM(t)
	api := &fakeOpenAI{}
	// Codex's own sandbox runs in nested srt and in a VM.
	own := nested || strategy == "microsandbox"
	if own {
		// A place the boundary alone lets the runtime write: /run in srt;
		// in a VM, where the runtime is the guest's agent user, the VM-local
		// data directory it owns.
		outside := "/run/outside"
		if strategy == "microsandbox" {
			outside = "/var/lib/agentconnect/data/outside"
		}
		api.cmd = `printf 'written by codex inside a boundary\n' > hello.txt; id; touch ` + outside + ` && echo RUN-WRITTEN || echo RUN-REFUSED`
	}
	srv, caFile := tlsServerWithCA(t, api)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	var home string
	if nested {
		home = nobodyHome(t)
		// Readable by nobody; npm's cache the daemon's own.
		b, _ := os.ReadFile(caFile)
		caFile = filepath.Join(filepath.Dir(home), "api-ca.pem")
		os.WriteFile(caFile, b, 0o644)
		cache := filepath.Join(home, "npm-cache")
		os.Mkdir(cache, 0o700)
		os.Chown(cache, nobody, nobody)
		t.Setenv("npm_config_cache", cache)
	} else {
		home = newHome(t)
	}
	cfg := writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"`+config+`}`)
	if nested {
		os.Chown(cfg, nobody, nobody)
		d := &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
		d.start()
		t.Cleanup(d.cleanup)
	} else {
		startDaemon(t, home)
	}
	// Inside a boundary the API is the host's loopback by its name; on host
	// it is the loopback itself, whose certificate the runtime is told to
	// trust as a user would (SSL_CERT_FILE).
	apiHost := fmt.Sprintf("host.agentconnect.internal:%d", port)
	extra := []string{"--allow-domain", apiHost}
	if nested {
		extra = append(extra, "--nested-sandbox")
	}
	if strategy == "host" {
		apiHost = fmt.Sprintf("127.0.0.1:%d", port)
		extra = []string{"--env", "SSL_CERT_FILE=" + caFile}
	}
	run(t, home, secretValue, "secret", "set", "openai", "--host", apiHost, "--header", "authorization")
	ok(t, home, append([]string{"agent", "create", "codex", "--strategy", strategy, "--runtime", "codex",
		"--secret", "OPENAI_API_KEY=openai"}, extra...)...)
	dir := agentDir(t, home, "codex")
	workspace := filepath.Join(dir, "workspace")
	// The model provider, as a user points Codex at a gateway: config.toml
	// in its home.
	os.MkdirAll(filepath.Join(dir, "home", ".codex"), 0o700)
	os.WriteFile(filepath.Join(dir, "home", ".codex", "config.toml"), []byte(fmt.Sprintf(`model_provider = "gateway"
model = "gpt-5"

[model_providers.gateway]
name = "gateway"
base_url = "https://%s/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
`, apiHost)), 0o600)
	if nested {
		for _, p := range []string{filepath.Join(dir, "home", ".codex"), filepath.Join(dir, "home", ".codex", "config.toml")} {
			os.Chown(p, nobody, nobody)
		}
	}

	// On host Codex's own settings apply, and where its sandbox runs the
	// daemon's: "auto" lets it edit the workspace. Inside srt without a
	// nested sandbox the daemon runs it without its own (which could not
	// start).
	args := []string{"codex", "WRITE-THE-FILE hello.txt, please", "--yes", "--json"}
	if strategy == "host" || own {
		args = append(args, "--mode", "auto")
	}
	c := startChat(t, home, "", args...)
	c.wait(0)
	diagnose := func() string {
		api.mu.Lock()
		defer api.mu.Unlock()
		return fmt.Sprintf("API calls: %v; tool outputs: %q\n%s", api.paths, api.outputs, c)
	}
	if stop := c.stopReason(); stop != "end_turn" {
		t.Errorf("the turn stopped with %q\n%s", stop, diagnose())
	}
	if data, err := os.ReadFile(filepath.Join(workspace, "hello.txt")); err != nil || string(data) != "written by codex inside a boundary\n" {
		t.Errorf("the tool's file: %q, %v\n%s", data, err, diagnose())
	}
	if len(c.events("tool_call")) == 0 {
		t.Errorf("no tool call was shown:\n%s", diagnose())
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.outputs) == 0 {
		t.Fatalf("the tool's output never came back: %v", api.paths)
	}
	for i, k := range api.keys {
		if k != secretValue {
			t.Errorf("%s was sent key %q, want the value", api.paths[i], k)
		}
	}
	if strategy != "host" {
		checkNoValue(t, home)
	}
	// The session ended with the chat; chat showed what session show
	// does.
	sess := c.of("daemon_session")
	want := "off: " + strategy
	if own {
		want = "on: "
		if !strings.Contains(api.outputs[0], "RUN-REFUSED") {
			t.Errorf("a write the boundary alone allows and Codex's writable roots do not hold: %q", api.outputs[0])
		}
		if strategy == "microsandbox" {
			checkGuestUser(t, api.outputs[0], filepath.Join(agentDir(t, home, "codex"), "workspace"))
		}
	}
	if len(sess) != 1 || !strings.HasPrefix(fmt.Sprint(sess[0]["nativeSandbox"]), want) {
		t.Errorf("the native sandbox, as chat shows it: %+v, want %q...", sess, want)
	}
	if own {
		// The mode without Codex's sandbox is not among the allowed ones:
		// switching to it is refused, and no turn runs.
		full := startChat(t, home, "", "codex", "WRITE-THE-FILE again, please", "--yes", "--json", "--mode", "full-access")
		full.wait(1)
		if !strings.Contains(full.stderr.String(), "session/set_mode full-access") || len(full.of("prompt")) != 0 {
			t.Errorf("a switch to full-access under the daemon's requirements:\n%s", full)
		}
	}
}

// tlsServerWithCA serves h over TLS on the loopback with a leaf
// certificate of a CA of its own, whose PEM file it returns.
func tlsServerWithCA(t *testing.T, h http.Handler) (*httptest.Server, string) {
	t.Helper()
	srv, caPEM, err := testtls.NewServer(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "api-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return srv, caFile
}
