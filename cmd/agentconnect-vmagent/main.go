// Command agentconnect-vmagent is PID 1 of a session's VM; see package
// vmagent.
package main

import "github.com/agentconnect-md/agentconnect/vmagent"

func main() { vmagent.Main() }
