package main

import "github.com/agentconnect-md/agentconnect/internal/leftovers"

// oursProcs lists the live processes the daemon is responsible for (see
// leftovers.Processes): its descendants, the orphans under the bench's
// subreaper and whatever names its home.
func oursProcs(d *daemon) []*leftovers.Proc {
	daemonPID := 0
	if !d.exited() {
		daemonPID = d.cmd.Process.Pid
	}
	return leftovers.Processes(daemonPID, d.home)
}
