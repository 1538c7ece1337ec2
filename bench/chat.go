package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/testtls"
)

// chatAPI is a fake OpenAI Responses API on loopback that streams one
// short message for any prompt: the model side of the chat measurement.
type chatAPI struct {
	srv   *httptest.Server
	caPEM []byte
}

func startChatAPI() (*chatAPI, error) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/responses" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		event := func(typ string, v map[string]any) {
			v["type"] = typ
			b, _ := json.Marshal(v)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, b)
			w.(http.Flusher).Flush()
		}
		msg := map[string]any{"type": "message", "role": "assistant", "id": "msg_1", "content": []any{}}
		event("response.created", map[string]any{"response": map[string]any{"id": "resp_1"}})
		event("response.output_item.added", map[string]any{"output_index": 0, "item": msg})
		event("response.output_text.delta", map[string]any{"output_index": 0, "item_id": "msg_1", "content_index": 0, "delta": "Hello."})
		msg["content"] = []any{map[string]any{"type": "output_text", "text": "Hello."}}
		event("response.output_item.done", map[string]any{"output_index": 0, "item": msg})
		event("response.completed", map[string]any{"response": map[string]any{"id": "resp_1",
			"usage": map[string]any{"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}}})
	})
	srv, caPEM, err := testtls.NewServer(h)
	if err != nil {
		return nil, err
	}
	return &chatAPI{srv: srv, caPEM: caPEM}, nil
}

func (c *chatAPI) close() { c.srv.Close() }

// chatRuns is how many chats are timed per strategy (after one not
// counted, which fills the runtime's caches).
func chatRuns(c counts, strategy string) int {
	if strategy == "microsandbox" {
		return max(c.VMStarts/3, 2)
	}
	return max(c.SrtExecs/5, 3)
}

// benchChat times `agentconnect chat` of a real Codex (codex-acp, the known
// runtime) against the fake API, per strategy: from the chat's start to
// the first streamed token of the answer, and to the turn's end. The
// session is started, talked to, stopped and removed by chat each time.
func benchChat(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m = "chat (codex, fake Responses API) to the first streamed token"
	if d.chat == nil {
		rep.note(m, "host p50", "unavailable: the bench's fake model API did not start")
		return nil
	}
	if _, err := exec.LookPath("npm"); err != nil {
		rep.note(m, "host p50", "unavailable: npm is not on PATH (make deps installs it)")
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	port := portOfServer(d.chat.srv)
	inside, loopback := fmt.Sprintf("host.agentconnect.internal:%d", port), fmt.Sprintf("127.0.0.1:%d", port)
	if _, err := a.SetSecret(ctx, &adminv1.SetSecretRequest{Name: "bench-openai", Value: "sk-bench-0123456789", Hosts: []string{inside, loopback}}); err != nil {
		return err
	}
	caFile := filepath.Join(d.home, "chat-api-ca.pem")
	if err := os.WriteFile(caFile, d.chat.caPEM, 0o644); err != nil {
		return err
	}
	for _, strategy := range []string{"host", "srt", "microsandbox"} {
		stat := strategy + " p50"
		switch {
		case strategy == "srt" && d.srtUnavailable != "":
			rep.note(m, stat, "unavailable: "+d.srtUnavailable)
			continue
		case strategy == "microsandbox" && d.vmUnavailable != "":
			rep.note(m, stat, "unavailable: "+d.vmUnavailable)
			continue
		}
		name := "bench-chat-" + strategy
		agent := &adminv1.Agent{Name: name, Strategy: strategy, Runtime: "codex",
			Secrets: []*adminv1.SecretBinding{{Env: "OPENAI_API_KEY", Secret: "bench-openai"}}}
		apiHost := inside
		if strategy == "host" {
			// No proxy on host: the runtime trusts the API's CA itself.
			apiHost, agent.Env = loopback, []string{"SSL_CERT_FILE=" + caFile}
		} else {
			agent.AllowedDomains = []string{inside}
		}
		made, err := a.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: agent})
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		if err := writeCodexProvider(made.Dir, apiHost); err != nil {
			return err
		}
		var first, end samples
		runs := chatRuns(c, strategy)
		for i := 0; i <= runs; i++ {
			f, e, err := timeChat(ctx, d, name)
			if err != nil {
				return fmt.Errorf("%s: %w", strategy, err)
			}
			if i > 0 {
				first.add(f)
				end.add(e)
			}
		}
		ref := fmt.Sprintf("n=%d, one more first not counted; chat's start to its first agent_message_chunk line", runs)
		if strategy == "microsandbox" {
			ref = fmt.Sprintf("n=%d; TCG, serial transport: the VM's boot is in it", runs)
		}
		rep.add(m, stat, first.median(), "ms", 0, ref)
		rep.add(m, strategy+" turn end p50", end.median(), "ms", 0, "")
	}
	return nil
}

// writeCodexProvider points the agent's Codex at the fake API, as a user
// points it at a gateway: config.toml in the agent's home.
func writeCodexProvider(agentDir, apiHost string) error {
	dir := filepath.Join(agentDir, "home", ".codex")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.toml"), []byte(fmt.Sprintf(`model_provider = "bench"
model = "gpt-5"

[model_providers.bench]
name = "bench"
base_url = "https://%s/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
`, apiHost)), 0o600)
}

// timeChat runs one chat of one prompt and returns the time to the first
// streamed token and to the turn's end.
func timeChat(ctx context.Context, d *daemon, agent string) (first, end time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.path("agentconnect"), "--home", d.home, "chat", agent, "Say hello.", "--yes", "--json")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	begin := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var line struct {
			Type   string `json:"type"`
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
			} `json:"update"`
		}
		json.Unmarshal(sc.Bytes(), &line)
		switch {
		case first == 0 && line.Type == "update" && line.Update.SessionUpdate == "agent_message_chunk":
			first = time.Since(begin)
		case line.Type == "turn_end":
			end = time.Since(begin)
		}
	}
	if err := cmd.Wait(); err != nil {
		return 0, 0, fmt.Errorf("chat %s: %v: %s", agent, err, strings.TrimSpace(stderr.String()))
	}
	if first == 0 || end == 0 {
		return 0, 0, fmt.Errorf("chat %s showed no streamed answer: %s", agent, strings.TrimSpace(stderr.String()))
	}
	return first, end, nil
}
