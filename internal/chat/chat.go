// Package chat is a terminal ACP client: it talks to a runtime over a pair
// of streams (the daemon's session stdin and output log), shows what the
// runtime does as a person reads it, and asks the person for permissions.
//
// The protocol side is github.com/coder/acp-go-sdk: its generated types
// follow the ACP schema, and its connection orders notifications before the
// response they precede, which a hand-written layer would have to redo.
package chat

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	acp "github.com/coder/acp-go-sdk"
)

// Permit is how permission requests are answered.
type Permit int

const (
	// Ask asks the person, reading the answer from Options.Input.
	Ask Permit = iota
	// Yes allows each request once (its first allow option).
	Yes
	// Deny refuses each request (its first reject option).
	Deny
)

// Options are one conversation's.
type Options struct {
	// ToRuntime and FromRuntime are the runtime's stdin and stdout.
	ToRuntime   io.Writer
	FromRuntime io.Reader
	// Out is where the conversation is shown; JSON makes it JSON lines.
	Out  io.Writer
	JSON bool
	// Input gives prompts (one a line) and the answers to questions.
	Input io.Reader
	// Prompt, when set, is the one prompt; Input then only answers.
	Prompt string
	Permit Permit
	// Cwd is the session's working directory as the runtime sees it.
	Cwd string
	// Auth is the method to authenticate with before session/new, when
	// the runtime offers it (codex: openai-api-key).
	Auth string
	// Mode, when set, is the session mode to switch to after session/new
	// (session/set_mode: codex's auto, Claude Code's acceptEdits).
	Mode string
	// Resume continues a conversation another client began (State read
	// from the session's log); nil starts a new one.
	Resume *State
	// Interrupt delivers Ctrl-C: during a turn it cancels the turn, a
	// second one (or one between turns) ends the conversation.
	Interrupt <-chan struct{}
	// Finished, when Resume has a turn in flight, gets that turn's stop
	// reason once its answer has come (WatchAnswer on FromRuntime sees it).
	Finished <-chan string
}

// ErrInterrupted ends a conversation the person interrupted.
var ErrInterrupted = errors.New("interrupted")

// Result is how a conversation ended.
type Result struct {
	SessionID  string
	StopReason string // of the last turn
}

// Run holds the conversation: initialize and session/new (or the resumed
// session), then a turn for each prompt until Input ends.
func Run(ctx context.Context, o Options) (Result, error) {
	v := &view{out: o.Out, json: o.JSON}
	cl := &client{o: o, v: v, in: readLines(o.Input)}
	conn := acp.NewClientSideConnection(cl, o.ToRuntime, o.FromRuntime)
	conn.SetLogger(discardLogger())
	var res Result
	if o.Resume == nil {
		sid, err := begin(ctx, conn, o)
		if err != nil {
			return res, err
		}
		res.SessionID = sid
		v.event(map[string]any{"type": "session", "sessionId": sid})
	} else {
		res.SessionID = o.Resume.SessionID
		v.event(map[string]any{"type": "session", "sessionId": res.SessionID, "resumed": true})
		stop, err := cl.finishResumed(ctx, conn, res.SessionID)
		if err != nil {
			return res, err
		}
		res.StopReason = stop
	}
	first := true
	for {
		prompt, ok, err := cl.nextPrompt(first)
		first = false
		if err != nil || !ok {
			return res, err
		}
		stop, err := cl.turn(ctx, conn, res.SessionID, prompt)
		res.StopReason = stop
		if err != nil {
			return res, err
		}
	}
}

// begin initializes the runtime and opens a session in o.Cwd.
func begin(ctx context.Context, conn *acp.ClientSideConnection, o Options) (string, error) {
	init, err := conn.Initialize(ctx, acp.InitializeRequest{
		ProtocolVersion:    acp.ProtocolVersionNumber,
		ClientCapabilities: acp.ClientCapabilities{},
		ClientInfo:         &acp.Implementation{Name: "agentconnect chat", Version: "1"},
	})
	if err != nil {
		return "", fmt.Errorf("initialize: %w", describe(err))
	}
	if o.Auth != "" && offers(init.AuthMethods, o.Auth) {
		if _, err := conn.Authenticate(ctx, acp.AuthenticateRequest{MethodId: o.Auth}); err != nil {
			return "", fmt.Errorf("authenticate with %s: %w", o.Auth, describe(err))
		}
	}
	s, err := conn.NewSession(ctx, acp.NewSessionRequest{Cwd: o.Cwd, McpServers: []acp.McpServer{}})
	if err != nil {
		var re *acp.RequestError
		if errors.As(err, &re) && re.Code == -32000 {
			return "", fmt.Errorf("the runtime asks to authenticate first (it offers %s): run chat with --auth METHOD, or log in once with agentconnect agent login", strings.Join(methodIDs(init.AuthMethods), ", "))
		}
		return "", fmt.Errorf("session/new: %w", describe(err))
	}
	if o.Mode != "" {
		if _, err := conn.SetSessionMode(ctx, acp.SetSessionModeRequest{SessionId: s.SessionId, ModeId: acp.SessionModeId(o.Mode)}); err != nil {
			return "", fmt.Errorf("session/set_mode %s: %w (the modes it offers: %s)", o.Mode, describe(err), modeIDs(s.Modes))
		}
	}
	return string(s.SessionId), nil
}

func offers(ms []acp.AuthMethod, id string) bool {
	for _, m := range methodIDs(ms) {
		if m == id {
			return true
		}
	}
	return false
}

func methodIDs(ms []acp.AuthMethod) []string {
	var ids []string
	for _, m := range ms {
		switch {
		case m.Agent != nil:
			ids = append(ids, m.Agent.Id)
		case m.EnvVar != nil:
			ids = append(ids, m.EnvVar.Id)
		case m.Terminal != nil:
			ids = append(ids, m.Terminal.Id)
		}
	}
	if len(ids) == 0 {
		return []string{"none"}
	}
	return ids
}

func modeIDs(m *acp.SessionModeState) string {
	if m == nil || len(m.AvailableModes) == 0 {
		return "none"
	}
	var ids []string
	for _, x := range m.AvailableModes {
		ids = append(ids, string(x.Id))
	}
	return strings.Join(ids, ", ")
}

// describe turns a JSON-RPC error into its message (and data).
func describe(err error) error {
	var re *acp.RequestError
	if errors.As(err, &re) {
		if re.Data != nil {
			b, _ := json.Marshal(re.Data)
			return fmt.Errorf("%s (%d): %s", re.Message, re.Code, b)
		}
		return fmt.Errorf("%s (%d)", re.Message, re.Code)
	}
	return err
}

// nextPrompt is the one prompt of Options.Prompt, or the next non-empty
// line of Input; ok is false at the end.
func (c *client) nextPrompt(first bool) (string, bool, error) {
	if c.o.Prompt != "" {
		return c.o.Prompt, first, nil
	}
	for {
		if !c.o.JSON {
			fmt.Fprint(c.o.Out, "\n> ")
		}
		l := line{err: io.EOF}
		select {
		case got, ok := <-c.in:
			if ok {
				l = got
			}
		case <-c.o.Interrupt:
			return "", false, nil
		}
		if t := strings.TrimSpace(l.s); t != "" {
			return t, true, nil
		}
		if l.err == io.EOF {
			if !c.o.JSON {
				fmt.Fprintln(c.o.Out)
			}
			return "", false, nil
		}
		if l.err != nil {
			return "", false, l.err
		}
	}
}

// line is one line of Input, or its end.
type line struct {
	s   string
	err error
}

// readLines reads r a line at a time for both prompts and answers, so that
// a question given up on leaves its line to what comes next. The channel
// closes after the line that carries the end.
func readLines(r io.Reader) <-chan line {
	ch := make(chan line)
	if r == nil {
		r = strings.NewReader("")
	}
	go func() {
		br := bufio.NewReader(r)
		for {
			s, err := br.ReadString('\n')
			ch <- line{s, err}
			if err != nil {
				close(ch)
				return
			}
		}
	}()
	return ch
}

// client is the client side the runtime calls: session updates and
// permission requests. It offers no file system or terminal.
type client struct {
	o  Options
	v  *view
	in <-chan line

	mu         sync.Mutex
	cancelling bool               // session/cancel sent for this turn
	asking     context.CancelFunc // ends a question being asked
}

// turn sends one prompt and shows the turn until its answer. Ctrl-C sends
// session/cancel and waits for the runtime to end the turn; a second one
// gives up on it.
func (c *client) turn(ctx context.Context, conn *acp.ClientSideConnection, sid, prompt string) (string, error) {
	c.mu.Lock()
	c.cancelling = false
	c.mu.Unlock()
	c.v.event(map[string]any{"type": "prompt", "text": prompt})
	type answer struct {
		resp acp.PromptResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := conn.Prompt(ctx, acp.PromptRequest{SessionId: acp.SessionId(sid), Prompt: []acp.ContentBlock{acp.TextBlock(prompt)}})
		done <- answer{r, err}
	}()
	for {
		select {
		case a := <-done:
			if a.err != nil {
				return "", fmt.Errorf("session/prompt: %w", describe(a.err))
			}
			c.v.end(string(a.resp.StopReason))
			return string(a.resp.StopReason), nil
		case <-c.o.Interrupt:
			if err := c.interrupt(ctx, conn, sid); err != nil {
				return "cancelled", err
			}
		case <-conn.Done():
			return "", errors.New("the runtime went away during the turn (see agentconnect session logs)")
		}
	}
}

// interrupt cancels the turn, or gives up when it is cancelled already.
func (c *client) interrupt(ctx context.Context, conn *acp.ClientSideConnection, sid string) error {
	c.mu.Lock()
	again := c.cancelling
	c.cancelling = true
	asking := c.asking
	c.mu.Unlock()
	if again {
		return ErrInterrupted
	}
	c.v.note("cancelling the turn (Ctrl-C again to leave)")
	if asking != nil {
		asking() // the protocol: pending permission requests end cancelled
	}
	return conn.Cancel(ctx, acp.CancelNotification{SessionId: acp.SessionId(sid)})
}

// finishResumed shows what the resumed session's turn in flight has done so
// far, answers its open permission requests, and waits for its end.
func (c *client) finishResumed(ctx context.Context, conn *acp.ClientSideConnection, sid string) (string, error) {
	st := c.o.Resume
	if st.InFlight == nil {
		return "", nil
	}
	c.v.note("a turn is in progress: showing it")
	for _, n := range st.Backlog {
		c.v.update(n.Update)
	}
	for _, p := range st.Pending {
		resp, _ := c.RequestPermission(ctx, p.Request)
		if err := respond(c.o.ToRuntime, p.ID, resp); err != nil {
			return "", err
		}
	}
	for {
		select {
		case stop := <-c.o.Finished:
			c.v.end(stop)
			return stop, nil
		case <-c.o.Interrupt:
			if err := c.interrupt(ctx, conn, sid); err != nil {
				return "cancelled", err
			}
		case <-conn.Done():
			return "", errors.New("the runtime went away during the turn (see agentconnect session logs)")
		}
	}
}

func (c *client) SessionUpdate(_ context.Context, n acp.SessionNotification) error {
	c.v.update(n.Update)
	return nil
}

func (c *client) RequestPermission(ctx context.Context, p acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	title := toolTitle(p.ToolCall)
	c.mu.Lock()
	cancelled := c.cancelling
	c.mu.Unlock()
	if cancelled {
		c.v.permission(title, p.Options, "", "cancelled")
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
	pick := func(kinds ...acp.PermissionOptionKind) (acp.PermissionOption, bool) {
		for _, k := range kinds {
			for _, o := range p.Options {
				if o.Kind == k {
					return o, true
				}
			}
		}
		return acp.PermissionOption{}, false
	}
	var chosen acp.PermissionOption
	var ok bool
	how := ""
	switch c.o.Permit {
	case Yes:
		chosen, ok = pick(acp.PermissionOptionKindAllowOnce, acp.PermissionOptionKindAllowAlways)
		how = "--yes"
	case Deny:
		chosen, ok = pick(acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways)
		how = "--deny"
	default:
		chosen, ok, how = c.ask(ctx, title, p.Options)
	}
	if !ok {
		c.v.permission(title, p.Options, "", "refused ("+how+")")
		if o, found := pick(acp.PermissionOptionKindRejectOnce, acp.PermissionOptionKindRejectAlways); found {
			return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(o.OptionId)}, nil
		}
		return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeCancelled()}, nil
	}
	c.v.permission(title, p.Options, chosen.Name, string(chosen.Kind)+" ("+how+")")
	return acp.RequestPermissionResponse{Outcome: acp.NewRequestPermissionOutcomeSelected(chosen.OptionId)}, nil
}

// ask shows the options and reads the person's choice from Input: a
// number, or an option's name. No answer (Input's end) refuses.
func (c *client) ask(ctx context.Context, title string, opts []acp.PermissionOption) (acp.PermissionOption, bool, string) {
	c.v.question(title, opts)
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	c.asking = cancel
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.asking = nil
		c.mu.Unlock()
		cancel()
	}()
	for {
		l := line{err: io.EOF}
		select {
		case got, ok := <-c.in:
			if ok {
				l = got
			}
		case <-ctx.Done():
			return acp.PermissionOption{}, false, "cancelled"
		}
		s := strings.TrimSpace(l.s)
		for i, o := range opts {
			if s == fmt.Sprint(i+1) || strings.EqualFold(s, o.Name) || s == string(o.OptionId) {
				return o, true, "answered"
			}
		}
		if l.err != nil {
			return acp.PermissionOption{}, false, "no answer"
		}
		if !c.o.JSON {
			fmt.Fprintf(c.o.Out, "  answer 1-%d: ", len(opts))
		}
	}
}

// The client offers no file system and no terminal (clientCapabilities
// are empty): the runtime uses its own tools, inside the boundary.
func (c *client) ReadTextFile(context.Context, acp.ReadTextFileRequest) (acp.ReadTextFileResponse, error) {
	return acp.ReadTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsReadTextFile)
}

func (c *client) WriteTextFile(context.Context, acp.WriteTextFileRequest) (acp.WriteTextFileResponse, error) {
	return acp.WriteTextFileResponse{}, acp.NewMethodNotFound(acp.ClientMethodFsWriteTextFile)
}

func (c *client) CreateTerminal(context.Context, acp.CreateTerminalRequest) (acp.CreateTerminalResponse, error) {
	return acp.CreateTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalCreate)
}

func (c *client) KillTerminal(context.Context, acp.KillTerminalRequest) (acp.KillTerminalResponse, error) {
	return acp.KillTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalKill)
}

func (c *client) TerminalOutput(context.Context, acp.TerminalOutputRequest) (acp.TerminalOutputResponse, error) {
	return acp.TerminalOutputResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalOutput)
}

func (c *client) ReleaseTerminal(context.Context, acp.ReleaseTerminalRequest) (acp.ReleaseTerminalResponse, error) {
	return acp.ReleaseTerminalResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalRelease)
}

func (c *client) WaitForTerminalExit(context.Context, acp.WaitForTerminalExitRequest) (acp.WaitForTerminalExitResponse, error) {
	return acp.WaitForTerminalExitResponse{}, acp.NewMethodNotFound(acp.ClientMethodTerminalWaitForExit)
}

func toolTitle(t acp.ToolCallUpdate) string {
	if t.Title != nil && *t.Title != "" {
		return *t.Title
	}
	return string(t.ToolCallId)
}

// respond writes the answer to request id as one JSON-RPC line, in one
// Write.
func respond(w io.Writer, id json.RawMessage, result any) error {
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": result})
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
