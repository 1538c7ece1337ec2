package chat

import (
	"context"
	"strings"
	"testing"

	acp "github.com/coder/acp-go-sdk"
)

// The text view as a person reads it: streamed chunks joined, a block's
// header once, tool calls with each new status, the plan, the turn's end.
func TestTextView(t *testing.T) {
	var b strings.Builder
	v := &view{out: &b}
	v.update(acp.UpdateAgentThoughtText("Let me "))
	v.update(acp.UpdateAgentThoughtText("look."))
	v.update(acp.UpdateAgentMessageText("I will write "))
	v.update(acp.UpdateAgentMessageText("it."))
	v.update(acp.StartToolCall("t1", "Write hello.txt", acp.WithStartKind(acp.ToolKindEdit)))
	v.update(acp.UpdateToolCall("t1", acp.WithUpdateStatus(acp.ToolCallStatusInProgress)))
	v.update(acp.UpdateToolCall("t1", acp.WithUpdateStatus(acp.ToolCallStatusInProgress)))
	v.update(acp.UpdateToolCall("t1", acp.WithUpdateStatus(acp.ToolCallStatusFailed),
		acp.WithUpdateContent([]acp.ToolCallContent{acp.ToolContent(acp.TextBlock("refused\nby the person"))})))
	v.update(acp.UpdatePlan(acp.PlanEntry{Content: "write", Status: "completed"}, acp.PlanEntry{Content: "check", Status: "pending"}))
	v.end("end_turn")
	want := `(thinking) Let me look.
I will write it.
* edit: Write hello.txt [pending]
  Write hello.txt: in_progress
  Write hello.txt: failed
    refused ...
plan:
  [x] write
  [ ] check
[turn ended: end turn]
`
	if b.String() != want {
		t.Errorf("the view:\n%s\nwant:\n%s", b.String(), want)
	}
}

// --yes picks an allow option, --deny a reject one; a person's answer is
// a number or a name; no answer refuses.
func TestPermissions(t *testing.T) {
	req := acp.RequestPermissionRequest{SessionId: "S", ToolCall: acp.ToolCallUpdate{ToolCallId: "t1"}, Options: []acp.PermissionOption{
		{OptionId: "always", Name: "Always Allow", Kind: acp.PermissionOptionKindAllowAlways},
		{OptionId: "once", Name: "Allow", Kind: acp.PermissionOptionKindAllowOnce},
		{OptionId: "no", Name: "Reject", Kind: acp.PermissionOptionKindRejectOnce},
	}}
	cases := []struct {
		name   string
		permit Permit
		input  string
		want   string // optionId; "" for cancelled
	}{
		{"yes", Yes, "", "once"},
		{"deny", Deny, "", "no"},
		{"a number", Ask, "1\n", "always"},
		{"a name after a wrong answer", Ask, "maybe\nreject\n", "no"},
		{"no answer", Ask, "", "no"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			cl := &client{o: Options{Permit: c.permit, JSON: true}, v: &view{out: &b, json: true}, in: readLines(strings.NewReader(c.input))}
			resp, err := cl.RequestPermission(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if resp.Outcome.Selected != nil {
				got = string(resp.Outcome.Selected.OptionId)
			}
			if got != c.want {
				t.Errorf("chose %q, want %q; shown:\n%s", got, c.want, b.String())
			}
		})
	}
}
