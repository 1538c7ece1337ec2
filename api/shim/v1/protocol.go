package shimv1

import "time"

// The parts of the supervisor ↔ shim protocol that are not ttrpc messages.

// MaxStdinWrite bounds one WriteStdin call; larger input is sent in pieces.
const MaxStdinWrite = 1 << 20

// StartTimeout is the longest any shim of this release takes to answer
// Start: a VM's boot (two minutes), its setup and the runtime's start in the
// guest (30 s), and a minute for the steps before (the VM's disks and
// virtiofsd; for srt the whole start). Every runner's own bounds fit in it
// (each has a test saying so). A supervisor waits longer than this for Start
// to answer, so that a slow start ends with the shim's own answer and reason.
const StartTimeout = 2*time.Minute + 30*time.Second + time.Minute

// Ready is what a serving shim reports on FDReady once it serves, or why it
// cannot (Launch).
type Ready struct {
	Address string `json:"address"`
	PID     int    `json:"pid"`
	// StartTime identifies the shim process with PID (procstat).
	StartTime uint64 `json:"startTime"`
	Error     string `json:"error,omitempty"`
	// Spare is Launch's: the shim was a spare (StartSpare), not a process
	// started for the session.
	Spare bool `json:"-"`
}
