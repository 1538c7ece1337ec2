// Package steps times the steps of a session's start for the log, so that a
// slow start says where its time went: the supervisor's side (cgroup, shim,
// dial, start) and the shim's (bind, exec, or a VM's boot).
package steps

import (
	"fmt"
	"strings"
	"time"
)

// Steps is the timing of one start, step after step.
type Steps struct {
	mark time.Time
	list []string
}

// New starts timing a start.
func New() *Steps { return &Steps{mark: time.Now()} }

// Done ends the step name.
func (st *Steps) Done(name string) {
	st.list = append(st.list, fmt.Sprintf("%s %v", name, time.Since(st.mark).Round(10*time.Microsecond)))
	st.mark = time.Now()
}

// Waited records that the start waited (a warm boundary, for the session
// that claims it) and restarts the timing from now.
func (st *Steps) Waited() {
	st.list = append(st.list, fmt.Sprintf("warm for %v", time.Since(st.mark).Round(time.Millisecond)))
	st.mark = time.Now()
}

// String lists the steps in order: "cgroup 1.2ms, shim 5.1ms".
func (st *Steps) String() string { return strings.Join(st.list, ", ") }
