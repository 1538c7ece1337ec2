package integration

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// fakeAnthropic is the Messages API, enough for one tool-using turn: a
// prompt asking for a file gets a Write tool call, the tool's result gets
// an end of turn. It records the API keys it was sent.
type fakeAnthropic struct {
	target string // the file the Write call writes
	// bash, when set, is the command of a Bash call made instead of the
	// Write; results are the tool results that came back.
	bash    string
	results []string
	mu      sync.Mutex
	keys    []string
	paths   []string
	// A prompt with STALL-THEN-WRITE waits for release (or for the
	// runtime to give up on the call) before it is answered as
	// WRITE-THE-FILE; stalled gets one value each time a call waits.
	release chan struct{}
	stalled chan struct{}
	// gaveUp counts stalled calls the runtime abandoned.
	gaveUp int
}

// setTarget sets the file the Write call writes, once the server runs.
func (f *fakeAnthropic) setTarget(path string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.target = path
}

// newFakeAnthropic is a fake whose stalls wait for release.
func newFakeAnthropic() *fakeAnthropic {
	return &fakeAnthropic{release: make(chan struct{}), stalled: make(chan struct{}, 16)}
}

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get("X-Api-Key"))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
	target := f.target
	f.mu.Unlock()
	if r.Method != "POST" || !strings.HasPrefix(r.URL.Path, "/v1/messages") || strings.Contains(r.URL.Path, "count_tokens") {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Stream bool `json:"stream"`
	}
	json.Unmarshal(body, &req)
	stall := strings.Contains(string(body), "STALL-THEN-WRITE") && !strings.Contains(string(body), `"tool_result"`)
	if stall && f.release != nil {
		f.stalled <- struct{}{}
		select {
		case <-f.release:
		case <-r.Context().Done():
			f.mu.Lock()
			f.gaveUp++
			f.mu.Unlock()
			return
		}
	}
	var blocks []map[string]any
	stop := "end_turn"
	switch {
	case strings.Contains(string(body), `"tool_result"`):
		f.mu.Lock()
		f.results = append(f.results, toolResults(body)...)
		f.mu.Unlock()
		blocks = []map[string]any{{"type": "text", "text": "The file is written."}}
	case f.bash != "" && strings.Contains(string(body), "WRITE-THE-FILE"):
		blocks = []map[string]any{{"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": map[string]any{"command": f.bash, "description": "Write the file"}}}
		stop = "tool_use"
	case stall || strings.Contains(string(body), "WRITE-THE-FILE"):
		blocks = []map[string]any{{"type": "tool_use", "id": "toolu_01", "name": "Write", "input": map[string]any{"file_path": target, "content": "written by claude inside a boundary\n"}}}
		stop = "tool_use"
	default:
		blocks = []map[string]any{{"type": "text", "text": "ok"}}
	}
	msg := map[string]any{"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
		"content": []any{}, "stop_reason": nil, "usage": map[string]int{"input_tokens": 10, "output_tokens": 0}}
	if !req.Stream {
		msg["content"], msg["stop_reason"] = blocks, stop
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(msg)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	event := func(name string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		w.(http.Flusher).Flush()
	}
	event("message_start", map[string]any{"type": "message_start", "message": msg})
	for i, b := range blocks {
		if b["type"] == "tool_use" {
			input, _ := json.Marshal(b["input"])
			event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(input)}})
		} else {
			event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": b["text"]}})
		}
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop}, "usage": map[string]int{"output_tokens": 5}})
	event("message_stop", map[string]any{"type": "message_stop"})
}

// toolResults are the texts of the tool results in a Messages request.
func toolResults(body []byte) []string {
	var req struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	json.Unmarshal(body, &req)
	var out []string
	for _, m := range req.Messages {
		var blocks []struct {
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(m.Content, &blocks) != nil {
			continue // a plain string
		}
		for _, b := range blocks {
			if b.Type != "tool_result" {
				continue
			}
			var text string
			if json.Unmarshal(b.Content, &text) == nil {
				out = append(out, text)
				continue
			}
			var parts []struct {
				Text string `json:"text"`
			}
			json.Unmarshal(b.Content, &parts)
			for _, p := range parts {
				out = append(out, p.Text)
			}
		}
	}
	return out
}

// TestClaudeTurnInSRTWithABoundKey: a real Claude Code (claude-agent-acp
// from npm) completes a tool-using turn inside srt against a fake Anthropic
// API on the host's loopback, its key bound from the secrets store: the API
// receives the value, the runtime holds the placeholder, and the tool's
// file is written in the workspace.
func TestClaudeTurnInSRTWithABoundKey(t *testing.T) {
	requireBwrap(t)
	claudeTurnWithABoundKey(t, "srt", "", false)
}

// TestClaudeOwnSandboxInNestedSRT: with nestedSandbox under an unprivileged
// daemon, Claude Code's own sandbox runs inside srt (managed settings: on,
// failing closed, its network through the session's proxy): its Bash
// tool writes the file in the workspace and is refused a write in /run,
// which srt alone allows.
func TestClaudeOwnSandboxInNestedSRT(t *testing.T) {
	requireRoot(t) // to make the unprivileged daemon's home
	requireBwrap(t)
	if _, err := exec.LookPath("socat"); err != nil {
		t.Skip("no socat, which Claude Code's sandbox needs (make deps installs it)")
	}
	claudeTurnWithABoundKey(t, "srt", "", true)
}

// TestClaudeTurnInMicrosandboxWithABoundKey: the same turn in a VM, its
// key put on the wire by the VM's network stack, as the guest's
// unprivileged user: its Bash tool writes the file, which belongs to the
// workspace's owner on the host. Under TCG (here) Claude Code's own
// sandbox is off, with the reason.
func TestClaudeTurnInMicrosandboxWithABoundKey(t *testing.T) {
	requireMicrosandbox(t)
	claudeTurnWithABoundKey(t, "microsandbox", `, "sandbox": {"microsandbox": {"accelerator": "tcg", "transport": "serial", "cpus": 2, "memoryMiB": 1024}}`, false)
}

// checkGuestUser checks a VM tool's output of id: the runtime ran as the
// guest's agent user (its docker group is checked with Docker itself, in
// TestMicrosandboxImageDockerAndRuntimes), and the file it wrote in the
// workspace (hello.txt) belongs on the host to the workspace's owner.
func checkGuestUser(t *testing.T, out, workspace string) {
	t.Helper()
	if !strings.Contains(out, "uid=10001(agent)") {
		t.Errorf("the runtime's id in the VM: %q, want uid 10001 (agent)", out)
	}
	var ws, f syscall.Stat_t
	if err := syscall.Stat(workspace, &ws); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(workspace, "hello.txt"), &f); err != nil {
		t.Fatal(err)
	}
	if f.Uid != ws.Uid || f.Gid != ws.Gid {
		t.Errorf("the guest's file is owned by %d:%d on the host, want the workspace's owner %d:%d", f.Uid, f.Gid, ws.Uid, ws.Gid)
	}
}

// TestClaudeOnHostUnderARootDaemon: on host under a root daemon, a session
// of Claude Code is refused with the reason and the ways out, before
// anything starts. With sandbox.host.user (nobody here) the runtime runs
// as that account and nothing else is needed: until the account can reach
// the daemon's home, host is unavailable with the reason; then the turn
// runs, its tool as nobody, and the agent's directories and the tool's
// file belong to nobody.
func TestClaudeOnHostUnderARootDaemon(t *testing.T) {
	requireRoot(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no account nobody: %v", err)
	}
	api := &fakeAnthropic{bash: `printf 'written by claude inside a boundary\n' > hello.txt; echo "uid $(id -u)"`}
	d, ws := claudeAgent(t, api, "host", "")
	c := startChat(t, d.home, "", "claude", "WRITE-THE-FILE hello.txt, please", "--yes", "--json")
	c.wait(1)
	if out := c.stderr.String(); !strings.Contains(out, "refuses to run as root") || !strings.Contains(out, "--strategy srt") || !strings.Contains(out, "sandbox.host.user") {
		t.Errorf("chat under a root daemon on host:\n%s", c)
	}
	api.mu.Lock()
	if len(api.paths) != 0 {
		t.Errorf("the refused session called the API: %v", api.paths)
	}
	api.mu.Unlock()
	var shown struct {
		Offered    bool
		NotOffered string
	}
	okJSON(t, d.home, &shown, "agent", "show", "claude")
	if shown.Offered || !strings.Contains(shown.NotOffered, "refuses to run as root") {
		t.Errorf("agent show of the refused agent: %+v", shown)
	}

	cfg, err := os.ReadFile(filepath.Join(d.home, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	writeConfig(t, d.home, strings.TrimSuffix(strings.TrimSpace(string(cfg)), "}")+`, "sandbox": {"host": {"user": "nobody"}}}`)
	ok(t, d.home, "restart")
	var st statusOut
	okJSON(t, d.home, &st, "status", "--json")
	if st.Strategies[0].Name != "host" || st.Strategies[0].Available || !strings.Contains(st.Strategies[0].Reason, "cannot reach the daemon's home") {
		t.Errorf("host with a home nobody cannot reach: %+v", st.Strategies[0])
	}
	// The test's temporary directories are 0700: the search bit for the
	// account, on the way to the home and to the API's CA file.
	ca := strings.TrimPrefix(envOf(t, d.home, "claude", "NODE_EXTRA_CA_CERTS"), "NODE_EXTRA_CA_CERTS=")
	for _, start := range []string{filepath.Dir(d.home), filepath.Dir(ca)} {
		for dir := start; dir != "/"; dir = filepath.Dir(dir) {
			if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o001 == 0 {
				os.Chmod(dir, fi.Mode().Perm()|0o001)
			}
		}
	}
	ok(t, d.home, "restart")
	if okJSON(t, d.home, &shown, "agent", "show", "claude"); !shown.Offered {
		t.Errorf("agent show with sandbox.host.user: %+v", shown)
	}
	c = startChat(t, d.home, "", "claude", "WRITE-THE-FILE hello.txt, please", "--yes", "--json", "--keep")
	c.wait(0)
	if stop := c.stopReason(); stop != "end_turn" {
		t.Errorf("the turn stopped with %q\n%s", stop, c)
	}
	checkClaudeFile(t, api, c)
	if len(api.results) == 0 || !strings.Contains(api.results[0], "uid "+nobody.Uid) {
		t.Errorf("the tool's uid: %q, want %s", api.results, nobody.Uid)
	}
	for _, p := range []string{ws, filepath.Join(ws, "hello.txt"), filepath.Join(filepath.Dir(ws), "home")} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || fmt.Sprint(st.Uid) != nobody.Uid {
			t.Errorf("%s: owned by uid %d (%v), want nobody's %s", p, st.Uid, err, nobody.Uid)
		}
	}
	ds := c.of("daemon_session")
	if len(ds) != 1 {
		t.Fatalf("chat's daemon_session lines: %v", ds)
	}
	var sess struct{ RunAs string }
	okJSON(t, d.home, &sess, "session", "show", fmt.Sprint(ds[0]["id"]))
	if want := "nobody (uid " + nobody.Uid + ")"; sess.RunAs != want {
		t.Errorf("session show's runAs: %q, want %q", sess.RunAs, want)
	}
	checkNoValue(t, d.home)
}

// envOf is the variable key of agent name's env, as KEY=VALUE ("" if none).
func envOf(t *testing.T, home, name, key string) string {
	t.Helper()
	var a struct{ Env []string }
	okJSON(t, home, &a, "agent", "show", name)
	for _, kv := range a.Env {
		if strings.HasPrefix(kv, key+"=") {
			return kv
		}
	}
	return ""
}

// claudeAgent is a daemon with a Claude Code agent "claude" in strategy
// (config: keys besides trustedCAFile), its key bound from the secrets
// store, talking to api; it returns the daemon and the workspace.
func claudeAgent(t *testing.T, api *fakeAnthropic, strategy, config string) (*daemon, string) {
	return claudeAgentOf(t, api, strategy, config, false)
}

// claudeAgentOf is claudeAgent; nested: in srt with nestedSandbox, under a
// daemon running as nobody, where Claude Code's own sandbox runs too.
func claudeAgentOf(t *testing.T, api *fakeAnthropic, strategy, config string, nested bool) (*daemon, string) {
	requireNPM(t)
	srv := httptest.NewTLSServer(api)
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	var home string
	var d *daemon
	if nested {
		home = nobodyHome(t)
	} else {
		home = newHome(t)
	}
	caFile := filepath.Join(filepath.Dir(home), fmt.Sprintf("api-ca-%d.pem", port))
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	t.Cleanup(func() { os.Remove(caFile) })
	cfg := writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"`+config+`}`)
	if nested {
		os.Chown(cfg, nobody, nobody)
		// npm's cache the daemon's own.
		cache := filepath.Join(home, "npm-cache")
		os.Mkdir(cache, 0o700)
		os.Chown(cache, nobody, nobody)
		t.Setenv("npm_config_cache", cache)
		d = &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
		d.start()
		t.Cleanup(d.cleanup)
	} else {
		d = startDaemon(t, home)
	}
	hostPort := fmt.Sprintf("host.agentconnect.internal:%d", port)
	extra := []string{"--allow-domain", hostPort}
	if nested {
		extra = append(extra, "--nested-sandbox")
	}
	if strategy == "host" {
		// No proxy: the runtime dials the loopback and trusts the API's
		// certificate itself, as a user would tell it to.
		hostPort = fmt.Sprintf("127.0.0.1:%d", port)
		extra = []string{"--env", "NODE_EXTRA_CA_CERTS=" + caFile}
	}
	run(t, home, secretValue, "secret", "set", "claude", "--host", hostPort, "--header", "x-api-key", "--header", "authorization")
	ok(t, home, append([]string{"agent", "create", "claude", "--strategy", strategy, "--runtime", "claude", "--secret", "ANTHROPIC_API_KEY=claude",
		"--env", "ANTHROPIC_BASE_URL=https://" + hostPort}, extra...)...)
	workspace := filepath.Join(agentDir(t, home, "claude"), "workspace")
	api.setTarget(filepath.Join(workspace, "hello.txt"))
	return d, workspace
}

// claudeTurnWithABoundKey runs the turn in strategy, with config keys
// besides trustedCAFile, through chat. The runtime is the known one, from
// the daemon's runtime cache.
// nested: in srt with nestedSandbox under an unprivileged daemon, where
// Claude Code's own sandbox runs inside.
func claudeTurnWithABoundKey(t *testing.T, strategy, config string, nested bool) {
	api := &fakeAnthropic{}
	switch {
	case strategy == "microsandbox":
		api.bash = `printf 'written by claude inside a boundary\n' > hello.txt; id; touch /var/lib/agentconnect/data/outside && echo RUN-WRITTEN || echo RUN-REFUSED`
	case nested:
		// /run is the srt sandbox's own tmpfs: srt allows the write,
		// Claude Code's sandbox (the workspace and its temporary
		// directory) does not.
		api.bash = `printf 'written by claude inside a boundary\n' > hello.txt; touch /run/outside && echo RUN-WRITTEN || echo RUN-REFUSED`
	}
	d, ws := claudeAgentOf(t, api, strategy, config, nested)
	c := startChat(t, d.home, "", "claude", "WRITE-THE-FILE hello.txt, please", "--yes", "--json")
	c.wait(0)
	if stop := c.stopReason(); stop != "end_turn" {
		api.mu.Lock()
		t.Errorf("the turn stopped with %q; API calls: %v\n%s", stop, api.paths, c)
		api.mu.Unlock()
	}
	checkClaudeFile(t, api, c)
	if len(c.events("tool_call")) == 0 {
		t.Errorf("no tool call was shown:\n%s", c)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	calls := 0
	for i, k := range api.keys {
		// Claude Code may check the base URL with a HEAD, which carries
		// no key; every Messages call must carry the value.
		if !strings.HasPrefix(api.paths[i], "POST /v1/messages") {
			continue
		}
		calls++
		if k != secretValue {
			t.Errorf("%s was sent key %q, want the value", api.paths[i], k)
		}
	}
	if calls == 0 {
		t.Fatal("the Messages API was never called")
	}
	checkNoValue(t, d.home)
	sess := c.of("daemon_session")
	if nested {
		if len(sess) != 1 || !strings.HasPrefix(fmt.Sprint(sess[0]["nativeSandbox"]), "on: Claude Code's sandbox") {
			t.Errorf("Claude Code's own sandbox, as chat shows it: %+v, want on", sess)
		}
		if len(api.results) == 0 || !strings.Contains(api.results[0], "RUN-REFUSED") {
			t.Errorf("a write srt allows and Claude Code's sandbox does not: %q", api.results)
		}
	}
	if strategy != "microsandbox" {
		return
	}
	// Under TCG Claude Code's sandbox cannot start its bridges in time:
	// off, with the reason, and the write the VM allows goes through.
	if len(sess) != 1 || !strings.HasPrefix(fmt.Sprint(sess[0]["nativeSandbox"]), "off: microsandbox under TCG") {
		t.Errorf("Claude Code's own sandbox, as chat shows it: %+v, want off under TCG", sess)
	}
	if len(api.results) == 0 || !strings.Contains(api.results[0], "RUN-WRITTEN") {
		t.Errorf("a write the VM allows its runtime user: %q", api.results)
	}
	if len(api.results) > 0 {
		checkGuestUser(t, api.results[0], ws)
	}
}
