package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// acpRun is a real runtime driven over ACP through `agentconnect exec`:
// JSON-RPC lines on its stdin and stdout, as an editor would speak it.
type acpRun struct {
	t       *testing.T
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   *bufio.Scanner
	stderr  *strings.Builder
	cancel  context.CancelFunc
	updates []map[string]any // session/update params, in order
	// permissions counts the session/request_permission calls answered.
	permissions int
	// diagnose adds what a failure report should show (the fake API's calls).
	diagnose func() string
}

// startACP runs agent through exec; the run ends with the test.
func startACP(t *testing.T, home, agent string) *acpRun {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, agentconnect(), "--home", home, "exec", agent)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	r := &acpRun{t: t, cmd: cmd, stdin: stdin, stderr: &strings.Builder{}, cancel: cancel, diagnose: func() string { return "" }}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	r.lines = bufio.NewScanner(stdout)
	r.lines.Buffer(make([]byte, 1<<20), 16<<20)
	t.Cleanup(func() {
		// The ACP adapters do not end at their stdin's end: exec passes
		// SIGTERM on to the runtime.
		stdin.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		cancel()
	})
	return r
}

func (r *acpRun) send(v map[string]any) {
	v["jsonrpc"] = "2.0"
	b, _ := json.Marshal(v)
	r.stdin.Write(append(b, '\n'))
}

// call sends method and waits for its answer, answering the runtime's
// permission requests with their first allowing option meanwhile; it
// fails the test on an error answer.
func (r *acpRun) call(id int, method string, params map[string]any) map[string]any {
	r.t.Helper()
	r.send(map[string]any{"id": id, "method": method, "params": params})
	for r.lines.Scan() {
		var m map[string]any
		if json.Unmarshal(r.lines.Bytes(), &m) != nil {
			continue
		}
		switch m["method"] {
		case "session/request_permission":
			r.permissions++
			r.send(map[string]any{"id": m["id"], "result": map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": allowOption(m)}}})
			continue
		case "session/update":
			if p, ok := m["params"].(map[string]any); ok {
				r.updates = append(r.updates, p)
			}
			continue
		}
		if fmt.Sprint(m["id"]) == fmt.Sprint(id) && m["method"] == nil {
			if m["error"] != nil {
				r.t.Fatalf("%s: %v\nstderr:\n%s\n%s", method, m["error"], r.stderr, r.diagnose())
			}
			res, _ := m["result"].(map[string]any)
			return res
		}
	}
	r.t.Fatalf("the runtime ended before answering %s; stderr:\n%s\n%s", method, r.stderr, r.diagnose())
	return nil
}

// allowOption is the id of a permission request's first allowing option.
func allowOption(m map[string]any) string {
	p, _ := m["params"].(map[string]any)
	opts, _ := p["options"].([]any)
	for _, o := range opts {
		if om, ok := o.(map[string]any); ok && strings.HasPrefix(fmt.Sprint(om["kind"]), "allow") {
			return fmt.Sprint(om["optionId"])
		}
	}
	return "allow"
}

// turn runs initialize (and authenticate with authMethod, when given),
// session/new in cwd, then one prompt; it returns the prompt's stop reason.
func (r *acpRun) turn(cwd, authMethod, mode, prompt string) string {
	r.t.Helper()
	began := time.Now()
	r.call(1, "initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}})
	if authMethod != "" {
		r.call(2, "authenticate", map[string]any{"methodId": authMethod})
	}
	res := r.call(3, "session/new", map[string]any{"cwd": cwd, "mcpServers": []any{}})
	sid := res["sessionId"]
	r.t.Logf("session/new answered after %v", time.Since(began))
	if mode != "" {
		r.call(4, "session/set_mode", map[string]any{"sessionId": sid, "modeId": mode})
	}
	res = r.call(5, "session/prompt", map[string]any{"sessionId": sid,
		"prompt": []any{map[string]any{"type": "text", "text": prompt}}})
	r.t.Logf("the turn ended after %v", time.Since(began))
	return fmt.Sprint(res["stopReason"])
}
