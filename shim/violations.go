package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

const (
	// violationsFlushInterval spaces the rewrites of violations.json: a
	// flood of refusals costs a few small writes a second, not one each.
	violationsFlushInterval = 250 * time.Millisecond
	// violationsSummaryInterval spaces the shim.log lines that count the
	// refusals not logged one by one.
	violationsSummaryInterval = time.Minute

	// Bounds on a kept refusal's fields, in bytes: with JSON's escapes an
	// entry stays under 2 KiB, so violations.json stays under 512 KiB.
	maxViolationProtocol = 16
	maxViolationHost     = 255 // a DNS name is at most 253; a longer file path is cut
	maxViolationAddr     = 64
	maxViolationReason   = 512
)

// Violations keeps a session's refusals in violations.json, de-duplicated:
// one entry per kind (protocol, host, port, reason) with a count and the
// first and last time, at most session.MaxViolationKinds kinds, the rest
// only counted. The srt proxy and the VM network both report through add.
// The file is rewritten at most every violationsFlushInterval and once more
// at close; shim.log gets a line for each new kind, one when the kinds run
// out, and at most one summary of the others per violationsSummaryInterval.
type Violations struct {
	dir session.Dir
	log *logrus.Entry

	mu          sync.Mutex // guards the fields below
	v           session.Violations
	index       map[violationKey]int
	dirty       bool      // changed since the last write
	unlogged    uint64    // refusals since the last summary, not logged one by one
	lastSummary time.Time // of the last summary line
	writeErr    string    // the last write error logged, so that a full disk is logged once

	wake      chan struct{} // a refusal came; holds at most one
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

type violationKey struct {
	protocol, host string
	port           int
	reason         string
}

// openViolationLog continues the session's violations.json (a resumed
// session keeps its earlier refusals), folding in the violations.jsonl an
// earlier version wrote.
func openViolations(dir session.Dir, log *logrus.Entry) *Violations {
	l := &Violations{
		dir: dir, log: log, index: map[violationKey]int{}, lastSummary: time.Now(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	v, err := dir.ReadViolations()
	if err != nil {
		// Only this shim writes it, atomically: unreadable means damaged;
		// the refusals from here on are kept in a new one.
		log.WithError(err).Warn("violations.json is unreadable; starting a new one")
		v = &session.Violations{}
	}
	l.v = *v
	for i, e := range l.v.Entries {
		l.index[keyOf(e.Violation)] = i
	}
	l.foldLegacy()
	go l.run()
	return l
}

// foldLegacy moves the refusals of a violations.jsonl (one line per refusal,
// unbounded) into the table, and removes the file once they are written.
func (l *Violations) foldLegacy() {
	path := l.dir.LegacyViolationsPath()
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		l.log.WithError(err).Warn("read the violations.jsonl of an earlier version")
		return
	}
	defer f.Close()
	// Nothing else uses the table yet: run has not started.
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20) // a line holds a host of up to 64 KiB, escaped
	for sc.Scan() {
		var v netpolicy.Violation
		if json.Unmarshal(sc.Bytes(), &v) == nil {
			l.addLocked(bound(v))
		}
	}
	// Their events were sent by the supervisor of the time.
	l.v.Imported = len(l.v.Entries)
	if err := l.dir.WriteViolations(&l.v, true); err != nil {
		l.log.WithError(err).Warn("fold violations.jsonl into violations.json")
		return
	}
	os.Remove(path)
}

func keyOf(v netpolicy.Violation) violationKey {
	return violationKey{protocol: v.Protocol, host: v.Host, port: v.Port, reason: v.Reason}
}

// add records one refusal. It is called from the proxy's and the network's
// goroutines, and never blocks on the disk.
func (l *Violations) Add(v netpolicy.Violation) {
	v = bound(v)
	l.mu.Lock()
	kept, dropped := l.addLocked(v)
	firstDrop := dropped && l.v.Dropped == 1
	if !kept {
		l.unlogged++
	}
	l.dirty = true
	l.mu.Unlock()
	switch {
	case kept && v.Protocol == netpolicy.ProtocolFile:
		l.log.WithField("path", v.Host).Warn(v.Reason)
	case kept:
		l.log.WithFields(logrus.Fields{"protocol": v.Protocol, "host": v.Host, "port": v.Port}).Warnf("network refused: %s", v.Reason)
	case firstDrop:
		l.log.Warnf("network refused: %d kinds of refusal kept; refusals of other kinds are only counted", session.MaxViolationKinds)
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// AddFile records what the run wrote that host tools would run (a git hook
// of a repository it created, say), found once it ended.
func (l *Violations) AddFile(path, reason string) {
	l.Add(netpolicy.Violation{Time: time.Now(), Protocol: netpolicy.ProtocolFile, Host: path, Reason: reason})
}

// addLocked counts v; kept says it is a new kind, dropped that it was a new
// kind with no room left.
func (l *Violations) addLocked(v netpolicy.Violation) (kept, dropped bool) {
	l.v.Total++
	k := keyOf(v)
	if i, ok := l.index[k]; ok {
		e := &l.v.Entries[i]
		e.Count++
		if v.Time.After(e.Time) {
			e.Time = v.Time
		}
		e.Addr = v.Addr
		return false, false
	}
	if len(l.v.Entries) >= session.MaxViolationKinds {
		l.v.Dropped++
		return false, true
	}
	l.index[k] = len(l.v.Entries)
	l.v.Entries = append(l.v.Entries, session.ViolationEntry{Violation: v, Count: 1, First: v.Time})
	return true, false
}

// bound cuts a refusal's fields, which the session chose, to printable text
// of bounded length.
func bound(v netpolicy.Violation) netpolicy.Violation {
	if v.Time.IsZero() {
		v.Time = time.Now()
	}
	v.Protocol = boundString(v.Protocol, maxViolationProtocol)
	v.Host = boundString(v.Host, maxViolationHost)
	v.Addr = boundString(v.Addr, maxViolationAddr)
	v.Reason = boundString(v.Reason, maxViolationReason)
	return v
}

func boundString(s string, n int) string {
	// Cut first: the work stays bounded however long s is. A rune cut in
	// two becomes a '?' below, which is shorter.
	if len(s) > n {
		s = s[:n]
	}
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return '?'
		}
		return r
	}, s)
}

// run writes the table when it changed, at most every
// violationsFlushInterval, until close.
func (l *Violations) run() {
	defer close(l.done)
	for {
		select {
		case <-l.wake:
		case <-l.stop:
			return
		}
		l.flush(false)
		select {
		case <-time.After(violationsFlushInterval):
		case <-l.stop:
			return
		}
	}
}

// flush writes violations.json if it changed, and logs the summary when it
// is due (or final: at the end of the run).
func (l *Violations) flush(final bool) {
	l.mu.Lock()
	var summary uint64
	if l.unlogged > 0 && (final || time.Since(l.lastSummary) >= violationsSummaryInterval) {
		summary, l.unlogged, l.lastSummary = l.unlogged, 0, time.Now()
	}
	dirty := l.dirty
	snap := l.v
	if dirty {
		snap.Entries = append([]session.ViolationEntry(nil), l.v.Entries...)
		l.dirty = false
	}
	l.mu.Unlock()
	if summary > 0 {
		l.log.WithFields(logrus.Fields{"refused": snap.Total, "kinds": len(snap.Entries), "notKept": snap.Dropped}).
			Warnf("network refused %d more connections of kinds already logged or not kept", summary)
	}
	if !dirty {
		return
	}
	err := l.dir.WriteViolations(&snap, final)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.dirty = true // try again with the next refusal, or at close
		if err.Error() != l.writeErr {
			l.writeErr = err.Error()
			l.log.WithError(err).Warn("record network violations")
		}
		return
	}
	l.writeErr = ""
}

// close writes what is left, durably, and stops the writer.
func (l *Violations) Close() {
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.flush(true)
	})
}
