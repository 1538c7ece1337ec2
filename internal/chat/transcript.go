package chat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"slices"

	acp "github.com/coder/acp-go-sdk"
)

// Record is a piece of a session's conversation as its log keeps it: what
// the runtime wrote (FromRuntime) or what a client wrote to it.
type Record struct {
	FromRuntime bool
	Data        []byte
}

// State is what a client that attaches to a running conversation needs to
// know of it, read from the log.
type State struct {
	SessionID string
	// InFlight is the id of a session/prompt not answered yet.
	InFlight json.RawMessage
	// Backlog are the updates of the turn in flight so far.
	Backlog []acp.SessionNotification
	// Pending are the runtime's permission requests nobody answered.
	Pending []PendingPermission
}

// PendingPermission is an open session/request_permission.
type PendingPermission struct {
	ID      json.RawMessage
	Request acp.RequestPermissionRequest
}

// message is any JSON-RPC message.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// Scan reads a conversation in log order. Each direction is a stream of
// lines of its own; a line may span records. A client's line is logged
// after the runtime could read it, so an answer is never seen before the
// question it answers, except a turn that ended before its prompt's record
// was written, which a turn's model call makes too slow to happen.
func Scan(records []Record) State {
	var st State
	var partial [2][]byte
	newIDs := map[string]bool{} // ids of session/new requests
	for _, r := range records {
		dir := 0
		if r.FromRuntime {
			dir = 1
		}
		buf := append(partial[dir], r.Data...)
		for {
			i := bytes.IndexByte(buf, '\n')
			if i < 0 {
				break
			}
			line := buf[:i]
			buf = buf[i+1:]
			var m message
			if json.Unmarshal(line, &m) != nil {
				continue // a runtime's stray output line
			}
			st.apply(m, r.FromRuntime, newIDs)
		}
		partial[dir] = append([]byte(nil), buf...)
	}
	return st
}

func (st *State) apply(m message, fromRuntime bool, newIDs map[string]bool) {
	id := string(m.ID)
	switch {
	case !fromRuntime && m.Method == acp.AgentMethodSessionNew:
		newIDs[id] = true
	case !fromRuntime && m.Method == acp.AgentMethodSessionPrompt:
		var p acp.PromptRequest
		if json.Unmarshal(m.Params, &p) == nil {
			st.SessionID = string(p.SessionId)
		}
		st.InFlight, st.Backlog = m.ID, nil
	case !fromRuntime && m.Method == "" && m.ID != nil:
		// An answer: the question is no longer open.
		st.Pending = slices.DeleteFunc(st.Pending, func(p PendingPermission) bool { return string(p.ID) == id })
	case fromRuntime && m.Method == "" && m.ID != nil:
		if newIDs[id] {
			var r acp.NewSessionResponse
			if json.Unmarshal(m.Result, &r) == nil && r.SessionId != "" {
				st.SessionID = string(r.SessionId)
			}
			delete(newIDs, id)
		}
		if st.InFlight != nil && id == string(st.InFlight) {
			// The turn is over: what it asked is moot.
			st.InFlight, st.Backlog, st.Pending = nil, nil, nil
		}
	case fromRuntime && m.Method == acp.ClientMethodSessionRequestPermission && m.ID != nil:
		var p acp.RequestPermissionRequest
		if json.Unmarshal(m.Params, &p) == nil {
			st.Pending = append(st.Pending, PendingPermission{ID: m.ID, Request: p})
		}
	case fromRuntime && m.Method == acp.ClientMethodSessionUpdate && st.InFlight != nil:
		var n acp.SessionNotification
		if json.Unmarshal(m.Params, &n) == nil {
			st.Backlog = append(st.Backlog, n)
		}
	}
}

// WatchAnswer passes r through and reports the stop reason of the answer
// to request id when it goes by: the library drops an answer to a request
// it did not send itself.
func WatchAnswer(r io.Reader, id json.RawMessage) (io.Reader, <-chan string) {
	pr, pw := io.Pipe()
	done := make(chan string, 1)
	go func() {
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				var m message
				if id != nil && json.Unmarshal(line, &m) == nil && m.Method == "" && string(m.ID) == string(id) {
					var res acp.PromptResponse
					json.Unmarshal(m.Result, &res)
					stop := string(res.StopReason)
					if stop == "" {
						stop = "error"
					}
					done <- stop
					id = nil
				}
				if _, werr := pw.Write(line); werr != nil {
					return
				}
			}
			if err != nil {
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr, done
}
