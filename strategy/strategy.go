// Package strategy names the execution strategies a session can run in, from
// no boundary to a separate VM.
package strategy

import "fmt"

// Name is an execution strategy.
type Name string

const (
	Host         Name = "host"         // no boundary: the runtime runs as the daemon user
	SRT          Name = "srt"          // bubblewrap + seccomp + user namespaces, network through a proxy
	Microsandbox Name = "microsandbox" // a microVM per session
)

// All lists the strategies from the weakest boundary to the strongest. The
// order is the order status and probe report them in.
var All = []Name{Host, SRT, Microsandbox}

// Sandboxes lists the strategies that are a boundary, in the order a new agent
// picks from when host is not available.
var Sandboxes = []Name{SRT, Microsandbox}

// Parse returns the strategy called s, or an error naming the valid ones.
func Parse(s string) (Name, error) {
	for _, n := range All {
		if string(n) == s {
			return n, nil
		}
	}
	return "", fmt.Errorf("unknown execution strategy %q (want host, srt or microsandbox)", s)
}
