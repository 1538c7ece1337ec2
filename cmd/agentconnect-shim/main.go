// Command agentconnect-shim runs one session of the host and srt strategies:
// the supervisor starts it with "serve"; see package shim. It links none of
// the VM code (cmd/agentconnect-shim-vm runs microsandbox sessions).
package main

import (
	"fmt"
	"os"

	"github.com/agentconnect-md/agentconnect/shim"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/strategy/host"
	"github.com/agentconnect-md/agentconnect/strategy/srt"
	"github.com/agentconnect-md/agentconnect/strategy/srt/sandbox"
)

func main() {
	err := shim.Main(os.Args[1:], shim.Config{
		Name:     "agentconnect-shim",
		Runners:  map[strategy.Name]shim.Runner{strategy.Host: host.Runner{}, strategy.SRT: srt.Runner()},
		Commands: map[string]func([]string) error{"sandbox-exec": sandbox.Exec},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentconnect-shim:", err)
		os.Exit(1)
	}
}
