package chat

import (
	"io"
	"strings"
	"testing"
	"time"
)

func rec(fromRuntime bool, s string) Record { return Record{FromRuntime: fromRuntime, Data: []byte(s)} }

// A conversation as a log keeps it, lines cut across records as pipes cut
// them.
func TestScan(t *testing.T) {
	base := []Record{
		rec(false, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`+"\n"),
		rec(true, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":1}}`+"\n"),
		rec(false, `{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}`+"\n"),
		rec(true, `{"jsonrpc":"2.0","id":2,"res`),
		rec(true, `ult":{"sessionId":"S1"}}`+"\nstray output of the runtime\n"),
	}
	prompt := rec(false, `{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"S1","prompt":[{"type":"text","text":"hi"}]}}`+"\n")
	update := rec(true, `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"S1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hel"}}}}`+"\n")
	ask := rec(true, `{"jsonrpc":"2.0","id":0,"method":"session/request_permission","params":{"sessionId":"S1","toolCall":{"toolCallId":"t1","title":"Write"},"options":[{"optionId":"allow","name":"Allow","kind":"allow_once"}]}}`+"\n")
	answer := rec(false, `{"jsonrpc":"2.0","id":0,"result":{"outcome":{"outcome":"selected","optionId":"allow"}}}`+"\n")
	done := rec(true, `{"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}`+"\n")

	cases := []struct {
		name     string
		recs     []Record
		inFlight string
		backlog  int
		pending  int
	}{
		{"no turn yet", base, "", 0, 0},
		{"a turn streaming", append(append([]Record{}, base...), prompt, update), "3", 1, 0},
		{"a question open", append(append([]Record{}, base...), prompt, update, ask), "3", 1, 1},
		{"a question answered", append(append([]Record{}, base...), prompt, update, ask, answer), "3", 1, 0},
		{"the turn over, its question moot", append(append([]Record{}, base...), prompt, ask, done), "", 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := Scan(c.recs)
			if st.SessionID != "S1" {
				t.Errorf("session = %q, want S1", st.SessionID)
			}
			if string(st.InFlight) != c.inFlight || len(st.Backlog) != c.backlog || len(st.Pending) != c.pending {
				t.Errorf("in flight %q, backlog %d, pending %d; want %q, %d, %d", st.InFlight, len(st.Backlog), len(st.Pending), c.inFlight, c.backlog, c.pending)
			}
		})
	}
}

// WatchAnswer passes every byte through and reports the answer it waits
// for, once.
func TestWatchAnswer(t *testing.T) {
	in := `{"jsonrpc":"2.0","method":"session/update","params":{}}` + "\n" +
		`{"jsonrpc":"2.0","id":7,"result":{"stopReason":"cancelled"}}` + "\n" +
		`{"jsonrpc":"2.0","id":3,"result":{"stopReason":"end_turn"}}` + "\n"
	r, done := WatchAnswer(strings.NewReader(in), []byte("3"))
	out, err := io.ReadAll(r)
	if err != nil || string(out) != in {
		t.Fatalf("passed through %q, %v", out, err)
	}
	select {
	case stop := <-done:
		if stop != "end_turn" {
			t.Errorf("stop = %q", stop)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the answer was not reported")
	}
}
