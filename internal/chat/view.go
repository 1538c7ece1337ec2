package chat

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	acp "github.com/coder/acp-go-sdk"
)

// view shows the conversation: text as a person reads it in a terminal,
// or one JSON object a line.
type view struct {
	out  io.Writer
	json bool

	mu    sync.Mutex
	block string            // what is being streamed: "message", "thought" or ""
	tools map[string]string // tool call id: its title
	last  map[string]string // tool call id: its last status shown
}

// event writes one JSON line (JSON mode only).
func (v *view) event(e map[string]any) {
	if !v.json {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	b, _ := json.Marshal(e)
	fmt.Fprintf(v.out, "%s\n", b)
}

// note is a line of the client's own.
func (v *view) note(s string) {
	if v.json {
		v.event(map[string]any{"type": "note", "text": s})
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.breakLocked()
	fmt.Fprintf(v.out, "[%s]\n", s)
}

// breakLocked ends a streamed block with a newline.
func (v *view) breakLocked() {
	if v.block != "" {
		fmt.Fprintln(v.out)
		v.block = ""
	}
}

func (v *view) update(u acp.SessionUpdate) {
	if v.json {
		v.event(map[string]any{"type": "update", "update": u})
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.tools == nil {
		v.tools, v.last = map[string]string{}, map[string]string{}
	}
	switch {
	case u.AgentMessageChunk != nil:
		v.streamLocked("message", "", u.AgentMessageChunk.Content)
	case u.AgentThoughtChunk != nil:
		v.streamLocked("thought", "(thinking) ", u.AgentThoughtChunk.Content)
	case u.UserMessageChunk != nil:
		v.streamLocked("user", "> ", u.UserMessageChunk.Content)
	case u.ToolCall != nil:
		t := u.ToolCall
		id := string(t.ToolCallId)
		v.tools[id] = t.Title
		v.breakLocked()
		fmt.Fprintf(v.out, "* %s%s [%s]\n", kindPrefix(string(t.Kind)), t.Title, orPending(string(t.Status)))
		v.last[id] = orPending(string(t.Status))
	case u.ToolCallUpdate != nil:
		t := u.ToolCallUpdate
		id := string(t.ToolCallId)
		if t.Title != nil && *t.Title != "" {
			v.tools[id] = *t.Title
		}
		if t.Status == nil || v.last[id] == string(*t.Status) {
			return
		}
		v.last[id] = string(*t.Status)
		v.breakLocked()
		title := v.tools[id]
		if title == "" {
			title = id
		}
		fmt.Fprintf(v.out, "  %s: %s\n", title, *t.Status)
		if *t.Status == acp.ToolCallStatusFailed {
			if s := contentText(t.Content); s != "" {
				fmt.Fprintf(v.out, "    %s\n", firstLine(s))
			}
		}
	case u.Plan != nil:
		v.breakLocked()
		fmt.Fprintln(v.out, "plan:")
		for _, e := range u.Plan.Entries {
			mark := map[acp.PlanEntryStatus]string{"completed": "x", "in_progress": "~"}[e.Status]
			if mark == "" {
				mark = " "
			}
			fmt.Fprintf(v.out, "  [%s] %s\n", mark, e.Content)
		}
	}
}

// streamLocked writes a chunk of a streamed block, with a header when the
// block begins.
func (v *view) streamLocked(block, header string, c acp.ContentBlock) {
	if c.Text == nil {
		return
	}
	if v.block != block {
		v.breakLocked()
		fmt.Fprint(v.out, header)
		v.block = block
	}
	fmt.Fprint(v.out, c.Text.Text)
}

func (v *view) question(title string, opts []acp.PermissionOption) {
	if v.json {
		v.event(map[string]any{"type": "question", "toolCall": title, "options": opts})
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.breakLocked()
	fmt.Fprintf(v.out, "? permission: %s\n", title)
	for i, o := range opts {
		fmt.Fprintf(v.out, "  %d) %s\n", i+1, o.Name)
	}
	fmt.Fprintf(v.out, "  answer 1-%d: ", len(opts))
}

// permission says how a request was answered.
func (v *view) permission(title string, opts []acp.PermissionOption, chosen, outcome string) {
	if v.json {
		v.event(map[string]any{"type": "permission", "toolCall": title, "options": opts, "chosen": chosen, "outcome": outcome})
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.breakLocked()
	if chosen != "" {
		fmt.Fprintf(v.out, "? permission: %s -> %s: %s\n", title, chosen, outcome)
		return
	}
	fmt.Fprintf(v.out, "? permission: %s -> %s\n", title, outcome)
}

// end closes a turn with its stop reason.
func (v *view) end(stop string) {
	if v.json {
		v.event(map[string]any{"type": "turn_end", "stopReason": stop})
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.breakLocked()
	fmt.Fprintf(v.out, "[turn ended: %s]\n", strings.ReplaceAll(stop, "_", " "))
}

func kindPrefix(kind string) string {
	if kind == "" || kind == "other" {
		return ""
	}
	return kind + ": "
}

func orPending(s string) string {
	if s == "" {
		return string(acp.ToolCallStatusPending)
	}
	return s
}

func contentText(cs []acp.ToolCallContent) string {
	for _, c := range cs {
		if c.Content != nil && c.Content.Content.Text != nil {
			return c.Content.Content.Text.Text
		}
	}
	return ""
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}

// discardLogger keeps the library's diagnostics (a line it cannot parse,
// such as a runtime's stray output) off the person's terminal.
func discardLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
