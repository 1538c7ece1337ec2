package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// claudeACPVersion is the claude-agent-acp the test runs, from npm.
const claudeACPVersion = "0.23.1"

// claudeACP installs claude-agent-acp (pinned) into a cache beside the
// binaries and returns its node_modules directory.
func claudeACP(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("npm is not installed (make deps installs it)")
	}
	dir := filepath.Join(binDir, "tools", "runtimes", "claude-agent-acp-"+claudeACPVersion)
	mods := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(mods, "@zed-industries", "claude-agent-acp", "dist", "index.js")); err == nil {
		return mods
	}
	os.MkdirAll(dir, 0o755)
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", dir, "@zed-industries/claude-agent-acp@"+claudeACPVersion)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install claude-agent-acp@%s: %v\n%s", claudeACPVersion, err, out)
	}
	return mods
}

// fakeAnthropic is the Messages API, enough for one tool-using turn: a
// prompt asking for a file gets a Write tool call, the tool's result gets
// an end of turn. It records the API keys it was sent.
type fakeAnthropic struct {
	target string // the file the Write call writes
	mu     sync.Mutex
	keys   []string
	paths  []string
}

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get("X-Api-Key"))
	f.paths = append(f.paths, r.Method+" "+r.URL.Path)
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
	var blocks []map[string]any
	stop := "end_turn"
	switch {
	case strings.Contains(string(body), `"tool_result"`):
		blocks = []map[string]any{{"type": "text", "text": "The file is written."}}
	case strings.Contains(string(body), "WRITE-THE-FILE"):
		blocks = []map[string]any{{"type": "tool_use", "id": "toolu_01", "name": "Write", "input": map[string]any{"file_path": f.target, "content": "written by claude inside a boundary\n"}}}
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

// TestClaudeTurnInSRTWithABoundKey: a real Claude Code (claude-agent-acp
// from npm) completes a tool-using turn inside srt against a fake Anthropic
// API on the host's loopback, its key bound from the secrets store: the API
// receives the value, the runtime holds the placeholder, and the tool's
// file is written in the workspace.
func TestClaudeTurnInSRTWithABoundKey(t *testing.T) {
	requireBwrap(t)
	claudeTurnWithABoundKey(t, "srt", "")
}

// TestClaudeTurnInMicrosandboxWithABoundKey: the same turn in a VM, its
// key put on the wire by the VM's network stack.
func TestClaudeTurnInMicrosandboxWithABoundKey(t *testing.T) {
	requireMicrosandbox(t)
	claudeTurnWithABoundKey(t, "microsandbox", `, "sandbox": {"microsandbox": {"accelerator": "tcg", "transport": "serial", "cpus": 2, "memoryMiB": 1024}}`)
}

// claudeTurnWithABoundKey runs the turn in strategy, with config keys
// besides trustedCAFile.
func claudeTurnWithABoundKey(t *testing.T, strategy, config string) {
	mods := claudeACP(t)
	home := newHome(t)
	api := &fakeAnthropic{}
	srv := httptest.NewTLSServer(api)
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	caFile := filepath.Join(t.TempDir(), "api-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"`+config+`}`)
	startDaemon(t, home)
	hostPort := fmt.Sprintf("host.agentconnect.internal:%d", port)
	run(t, home, secretValue, "secret", "set", "claude", "--host", hostPort, "--header", "x-api-key", "--header", "authorization")
	ok(t, home, "agent", "create", "claude", "--strategy", strategy, "--secret", "ANTHROPIC_API_KEY=claude",
		"--allow-domain", hostPort, "--mount", mods+":/opt/acp/node_modules:ro",
		"--env", "ANTHROPIC_BASE_URL=https://"+hostPort, "--env", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "--env", "DISABLE_AUTOUPDATER=1",
		"--", "node", "/opt/acp/node_modules/@zed-industries/claude-agent-acp/dist/index.js")
	workspace := filepath.Join(agentDir(t, home, "claude"), "workspace")
	api.target = filepath.Join(workspace, "hello.txt")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentconnect(), "--home", home, "exec", "claude")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// claude-agent-acp does not end at its stdin's end: exec passes
		// SIGTERM on to it.
		stdin.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	send := func(v map[string]any) {
		v["jsonrpc"] = "2.0"
		b, _ := json.Marshal(v)
		stdin.Write(append(b, '\n'))
	}
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 16<<20)
	// wait reads messages until the answer to id, answering the runtime's
	// permission requests with its first allowing option.
	wait := func(id int) map[string]any {
		for lines.Scan() {
			var m map[string]any
			if json.Unmarshal(lines.Bytes(), &m) != nil {
				continue
			}
			if m["method"] == "session/request_permission" {
				option := "allow"
				if p, ok := m["params"].(map[string]any); ok {
					if opts, ok := p["options"].([]any); ok {
						for _, o := range opts {
							if om, ok := o.(map[string]any); ok && strings.HasPrefix(fmt.Sprint(om["kind"]), "allow") {
								option = fmt.Sprint(om["optionId"])
								break
							}
						}
					}
				}
				send(map[string]any{"id": m["id"], "result": map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": option}}})
				continue
			}
			if fmt.Sprint(m["id"]) == fmt.Sprint(id) && m["method"] == nil {
				return m
			}
		}
		t.Fatalf("the runtime ended before answering %d; stderr:\n%s\nAPI calls: %v", id, stderr.String(), api.paths)
		return nil
	}
	began := time.Now()
	send(map[string]any{"id": 1, "method": "initialize", "params": map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}})
	if r := wait(1); r["error"] != nil {
		t.Fatalf("initialize: %v", r["error"])
	}
	send(map[string]any{"id": 2, "method": "session/new", "params": map[string]any{"cwd": workspace, "mcpServers": []any{}}})
	r := wait(2)
	res, _ := r["result"].(map[string]any)
	if res == nil {
		t.Fatalf("session/new: %v\nstderr:\n%s", r["error"], stderr.String())
	}
	send(map[string]any{"id": 3, "method": "session/prompt", "params": map[string]any{"sessionId": res["sessionId"],
		"prompt": []any{map[string]any{"type": "text", "text": "WRITE-THE-FILE hello.txt, please"}}}})
	t.Logf("session/new answered after %v", time.Since(began))
	r = wait(3)
	t.Logf("the turn ended after %v; API calls: %v", time.Since(began), api.paths)
	if res, _ := r["result"].(map[string]any); res == nil || res["stopReason"] != "end_turn" {
		t.Errorf("session/prompt: %v\nstderr:\n%s\nAPI calls: %v", r, stderr.String(), api.paths)
	}
	if data, err := os.ReadFile(api.target); err != nil || string(data) != "written by claude inside a boundary\n" {
		t.Errorf("the tool's file: %q, %v", data, err)
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
	checkNoValue(t, home)
}
