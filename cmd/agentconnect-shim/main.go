// Command agentconnect-shim runs one session of agentconnect: the supervisor
// starts it with "start"; see package shim.
package main

import (
	"fmt"
	"os"

	"github.com/agentconnect-md/agentconnect/shim"
)

func main() {
	if err := shim.Main(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "agentconnect-shim:", err)
		os.Exit(1)
	}
}
