package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// chatRun is `agentconnect chat ... --json` run by a test: its JSON lines
// as they come, its stdin open for answers.
type chatRun struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *strings.Builder

	mu     sync.Mutex
	lines  []map[string]any
	raw    []string
	more   chan struct{} // a value for each line read
	closed chan struct{} // stdout ended
	reaped sync.Once
	code   int
}

// startChat runs chat against home with args; stdin, when not empty, is
// written first (and stdin stays open until closeStdin).
func startChat(t *testing.T, home, stdin string, args ...string) *chatRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, agentconnect(), append([]string{"--home", home, "chat"}, args...)...)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	c := &chatRun{t: t, cmd: cmd, stdin: in, stderr: &strings.Builder{}, more: make(chan struct{}, 1024), closed: make(chan struct{}), code: -1}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	if stdin != "" {
		io.WriteString(in, stdin)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var m map[string]any
			json.Unmarshal(sc.Bytes(), &m)
			c.mu.Lock()
			c.lines = append(c.lines, m)
			c.raw = append(c.raw, sc.Text())
			c.mu.Unlock()
			c.more <- struct{}{}
		}
		close(c.closed)
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Signal(syscall.SIGTERM)
		c.reap()
		cancel()
	})
	return c
}

func (c *chatRun) reap() {
	c.reaped.Do(func() {
		<-c.closed
		c.cmd.Wait()
		c.code = c.cmd.ProcessState.ExitCode()
	})
}

// wait waits for the chat to end and checks its exit code.
func (c *chatRun) wait(code int) {
	c.t.Helper()
	c.stdin.Close()
	done := make(chan struct{})
	go func() { c.reap(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		c.t.Fatalf("chat did not end:\n%s", c)
	}
	if c.code != code {
		c.t.Errorf("chat exited %d, want %d\n%s", c.code, code, c)
	}
}

// waitFor waits until a line satisfies cond and returns it.
func (c *chatRun) waitFor(what string, cond func(map[string]any) bool) map[string]any {
	c.t.Helper()
	seen := 0
	deadline := time.After(3 * time.Minute)
	for {
		c.mu.Lock()
		for ; seen < len(c.lines); seen++ {
			if cond(c.lines[seen]) {
				m := c.lines[seen]
				c.mu.Unlock()
				return m
			}
		}
		c.mu.Unlock()
		select {
		case <-c.more:
		case <-c.closed:
			c.mu.Lock()
			n := len(c.lines)
			c.mu.Unlock()
			if seen == n {
				c.t.Fatalf("chat ended before %s:\n%s", what, c)
			}
		case <-deadline:
			c.t.Fatalf("no %s from chat:\n%s", what, c)
		}
	}
}

func isType(typ string) func(map[string]any) bool {
	return func(m map[string]any) bool { return m["type"] == typ }
}

// events are the updates of kind sessionUpdate shown, in order.
func (c *chatRun) events(kind string) []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, m := range c.lines {
		if u, ok := m["update"].(map[string]any); ok && m["type"] == "update" && u["sessionUpdate"] == kind {
			out = append(out, u)
		}
	}
	return out
}

// of are the lines of a type.
func (c *chatRun) of(typ string) []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []map[string]any
	for _, m := range c.lines {
		if m["type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

// stopReason is the last turn's.
func (c *chatRun) stopReason() string {
	ends := c.of("turn_end")
	if len(ends) == 0 {
		return ""
	}
	return fmt.Sprint(ends[len(ends)-1]["stopReason"])
}

func (c *chatRun) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return "stdout:\n" + strings.Join(c.raw, "\n") + "\nstderr:\n" + c.stderr.String()
}

// stalledChat is a Claude Code agent in srt whose chat of one turn
// (answering --yes) waits on its model call.
func stalledChat(t *testing.T) (*daemon, *fakeAnthropic, *chatRun) {
	t.Helper()
	requireBwrap(t)
	api := newFakeAnthropic()
	d, _ := claudeAgent(t, api, "srt", "")
	c := startChat(t, d.home, "", "claude", "STALL-THEN-WRITE hello.txt, please", "--yes", "--json")
	waitStalled(t, api, c)
	return d, api, c
}

// checkClaudeFile checks the file the fake's Write call writes.
func checkClaudeFile(t *testing.T, api *fakeAnthropic, c *chatRun) {
	t.Helper()
	if data, err := os.ReadFile(api.target); err != nil || string(data) != "written by claude inside a boundary\n" {
		t.Errorf("the tool's file: %q, %v\n%s", data, err, c)
	}
}

// waitStalled waits until the fake API holds a call.
func waitStalled(t *testing.T, api *fakeAnthropic, c *chatRun) {
	t.Helper()
	select {
	case <-api.stalled:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the model API was never called with the stalling prompt:\n%s", c)
	}
}

// TestChatAsksForPermission: a person answers Claude Code's permission
// request on chat's stdin (here the test, reading the question's options
// from the JSON lines); the tool then writes its file.
func TestChatAsksForPermission(t *testing.T) {
	requireBwrap(t)
	api := &fakeAnthropic{}
	d, _ := claudeAgent(t, api, "srt", "")
	c := startChat(t, d.home, "", "claude", "WRITE-THE-FILE hello.txt, please", "--json")
	q := c.waitFor("a permission question", isType("question"))
	answer := 0
	opts, _ := q["options"].([]any)
	for i, o := range opts {
		if om, _ := o.(map[string]any); om["kind"] == "allow_once" {
			answer = i + 1
		}
	}
	if answer == 0 {
		t.Fatalf("the question offers no allow_once option: %v", q)
	}
	fmt.Fprintf(c.stdin, "%d\n", answer)
	c.wait(0)
	perms := c.of("permission")
	if len(perms) == 0 || perms[0]["outcome"] != "allow_once (answered)" {
		t.Errorf("the permission as shown: %v\n%s", perms, c)
	}
	checkClaudeFile(t, api, c)
}

// TestChatDenyRefusesTheTool: with --deny the permission is refused, the
// tool call ends failed, and no file is written.
func TestChatDenyRefusesTheTool(t *testing.T) {
	requireBwrap(t)
	api := &fakeAnthropic{}
	d, _ := claudeAgent(t, api, "srt", "")
	c := startChat(t, d.home, "", "claude", "WRITE-THE-FILE hello.txt, please", "--deny", "--json")
	c.wait(0)
	perms := c.of("permission")
	if len(perms) == 0 || perms[0]["outcome"] != "reject_once (--deny)" {
		t.Errorf("the permission as shown: %v\n%s", perms, c)
	}
	failed := false
	for _, u := range c.events("tool_call_update") {
		failed = failed || u["status"] == "failed"
	}
	if !failed {
		t.Errorf("no tool call ended failed:\n%s", c)
	}
	if _, err := os.Stat(api.target); !os.IsNotExist(err) {
		t.Errorf("the refused tool's file: %v", err)
	}
}

// TestChatCtrlCCancelsTheTurn: SIGINT during a turn sends session/cancel:
// the runtime abandons its model call, the turn ends cancelled, and chat
// exits 130.
func TestChatCtrlCCancelsTheTurn(t *testing.T) {
	_, api, c := stalledChat(t)
	c.cmd.Process.Signal(syscall.SIGINT)
	c.waitFor("the turn's end", isType("turn_end"))
	c.wait(130)
	if stop := c.stopReason(); stop != "cancelled" {
		t.Errorf("the turn stopped with %q, want cancelled\n%s", stop, c)
	}
	eventually(t, 30*time.Second, "the runtime to abandon its model call", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.gaveUp > 0
	})
	if _, err := os.Stat(api.target); !os.IsNotExist(err) {
		t.Errorf("the cancelled turn's file: %v", err)
	}
}

// TestChatTurnSurvivesSupervisorSIGKILL: the supervisor is SIGKILLed and
// started again during a turn; the chat carries on and shows the turn to
// its end, and the tool's file is written.
func TestChatTurnSurvivesSupervisorSIGKILL(t *testing.T) {
	d, api, c := stalledChat(t)
	d.kill9()
	d.restart()
	close(api.release)
	c.wait(0)
	if stop := c.stopReason(); stop != "end_turn" {
		t.Errorf("the turn stopped with %q\n%s", stop, c)
	}
	checkClaudeFile(t, api, c)
}

// TestChatReattachesToATurnInProgress: the chat and the supervisor are
// both SIGKILLed during a turn; after the supervisor is back, chat
// --session attaches to the conversation, shows the turn going on to its
// end, and a new prompt goes to the same ACP session.
func TestChatReattachesToATurnInProgress(t *testing.T) {
	d, api, first := stalledChat(t)
	id := fmt.Sprint(first.waitFor("the daemon session", isType("daemon_session"))["id"])
	acpSession := fmt.Sprint(first.waitFor("the ACP session", isType("session"))["sessionId"])
	first.cmd.Process.Kill()
	first.reap()
	d.kill9()
	d.restart()
	if s := show(t, d.home, id); s.State != "running" {
		t.Fatalf("the session after its chat was killed: %+v", s)
	}

	second := startChat(t, d.home, "", "--session", id, "--yes", "--json")
	resumed := second.waitFor("the resumed session", isType("session"))
	if resumed["sessionId"] != acpSession || resumed["resumed"] != true {
		t.Errorf("chat --session resumed %v, want ACP session %s", resumed, acpSession)
	}
	second.waitFor("the turn in progress", func(m map[string]any) bool {
		return m["type"] == "note" && strings.Contains(fmt.Sprint(m["text"]), "turn is in progress")
	})
	close(api.release)
	second.waitFor("the turn's end", isType("turn_end"))
	fmt.Fprintln(second.stdin, "WRITE-THE-FILE again, please")
	second.wait(0)
	ends := second.of("turn_end")
	if len(ends) != 2 || ends[0]["stopReason"] != "end_turn" || ends[1]["stopReason"] != "end_turn" {
		t.Errorf("the turns as the second chat showed them: %v\n%s", ends, second)
	}
	checkClaudeFile(t, api, second)
	// The log keeps chat's side of the conversation, but session logs
	// shows the runtime's output only.
	if logs := ok(t, d.home, "session", "logs", id); strings.Contains(logs, `"method":"session/prompt"`) {
		t.Errorf("session logs shows what chat wrote to the runtime:\n%s", logs)
	}
	// The session was not the second chat's to end.
	if s := show(t, d.home, id); s.State != "running" {
		t.Errorf("the session after chat --session ended: %+v", s)
	}
}

// TestChatStandalone: chat --standalone runs Claude Code in an srt sandbox
// of its own, no daemon running: the turn writes its file in --workspace,
// and nothing of the private daemon is left afterwards.
func TestChatStandalone(t *testing.T) {
	requireBwrap(t)
	requireNPM(t)
	api := &fakeAnthropic{}
	// With no daemon there is no proxy to trust the API for the runtime:
	// its own TLS goes through to a certificate for the name it dials,
	// whose CA the runtime is told of, in the workspace where it sees it.
	srv, ca := tlsServerWithCA(t, api)
	workspace := t.TempDir()
	caFile := filepath.Join(workspace, "api-ca.pem")
	if b, err := os.ReadFile(ca); err != nil || os.WriteFile(caFile, b, 0o644) != nil {
		t.Fatal(err)
	}
	api.setTarget(filepath.Join(workspace, "hello.txt"))
	hostPort := fmt.Sprintf("host.agentconnect.internal:%d", srv.Listener.Addr().(*net.TCPAddr).Port)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the private home goes, to look for leftovers
	c := startChat(t, newHome(t), "", "--standalone", "--runtime", "claude", "--workspace", workspace,
		"--allow-domain", hostPort, "--env", "ANTHROPIC_BASE_URL=https://"+hostPort, "--env", "NODE_EXTRA_CA_CERTS="+caFile,
		"--env", "ANTHROPIC_API_KEY=sk-test", "--yes", "--json", "WRITE-THE-FILE hello.txt, please")
	c.wait(0)
	if stop := c.stopReason(); stop != "end_turn" {
		t.Errorf("the turn stopped with %q\n%s", stop, c)
	}
	if s := c.of("daemon_session"); len(s) != 1 || s[0]["strategy"] != "srt" {
		t.Errorf("the standalone session: %v", s)
	}
	checkClaudeFile(t, api, c)
	if left, _ := filepath.Glob(filepath.Join(tmp, "agentconnect-chat-*")); len(left) != 0 {
		t.Errorf("the private home is left: %v", left)
	}
	if out, _ := exec.Command("pgrep", "-f", "agentconnect-shim.*agentconnect-chat-").Output(); len(out) != 0 {
		t.Errorf("a shim of the standalone chat is left: %s", out)
	}
}
