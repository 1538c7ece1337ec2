// Command agentconnect-shim-vm runs one session of the microsandbox strategy:
// a VM per run, with the guest's network stack and its transports; see
// package shim. It also answers the daemon's microsandbox check (probe:
// api/helper); agentconnect-vmimage prepares the guest images.
package main

import (
	"fmt"
	"os"

	"github.com/agentconnect-md/agentconnect/shim"
	"github.com/agentconnect-md/agentconnect/strategy"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
)

func main() {
	err := shim.Main(os.Args[1:], shim.Config{
		Name:    "agentconnect-shim-vm",
		Runners: map[strategy.Name]shim.Runner{strategy.Microsandbox: microsandbox.Runner{}},
		Commands: map[string]func([]string) error{
			"share-exec": microvm.ShareExec,
			"probe":      func([]string) error { return microsandbox.ProbeMain(os.Stdin, os.Stdout) },
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentconnect-shim-vm:", err)
		os.Exit(1)
	}
}
