package supervisor

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/agentconnect-md/agentconnect/filewatch"
	"github.com/agentconnect-md/agentconnect/session"
)

// recentViolations is how many refusals `session show` lists.
const recentViolations = 20

// readViolations returns how many refusals a session's log holds and the
// most recent ones.
func readViolations(dir session.Dir) (count int, recent []session.Violation) {
	f, err := os.Open(dir.ViolationsPath())
	if err != nil {
		return 0, nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var v session.Violation
		if json.Unmarshal(sc.Bytes(), &v) != nil {
			continue
		}
		count++
		recent = append(recent, v)
		if len(recent) > recentViolations {
			recent = recent[1:]
		}
	}
	return count, recent
}

// followViolations turns each refusal the shim logs while the run lasts
// into a session.violation event. It starts at the log's current end: what
// came before was reported by the supervisor that was running then.
func (s *Supervisor) followViolations(ss *sessionState, run uint32) {
	path := ss.dir.ViolationsPath()
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
		f.Close()
	}
	w, err := filewatch.Watch(path)
	if err != nil {
		s.sessionLog(ss).WithError(err).Warn("follow network violations")
		return
	}
	defer func() { go w.Close() }() // see attach
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	f.Seek(0, io.SeekEnd)
	r := bufio.NewReader(f)
	agentName := ss.record().Agent
	var partial []byte
	for {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				partial = append(partial, line...)
				break
			}
			line = append(partial, line...)
			partial = nil
			var v session.Violation
			if json.Unmarshal(line, &v) == nil {
				s.events.add(event{Type: "session.violation", SessionID: ss.id, Agent: agentName,
					Message: fmt.Sprintf("%s %s:%d refused: %s", v.Protocol, v.Host, v.Port, v.Reason)})
			}
		}
		state, removed, changed := ss.watch()
		if state != session.Running || removed || ss.record().Run != run {
			return
		}
		select {
		case <-w.C:
		case <-changed:
		case <-s.ctx.Done():
			return
		}
	}
}
