// Command subreaper runs a command as a child subreaper that reaps every
// orphan, for `make demo` on machines whose PID 1 does not reap.
//
//	subreaper CMD [ARG...]
package main

import (
	"fmt"
	"os"
	"os/exec"

	"github.com/agentconnect-md/agentconnect/internal/reaper"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: subreaper CMD [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	code, err := reaper.Run(cmd)
	if err != nil {
		fmt.Fprintln(os.Stderr, "subreaper:", err)
		os.Exit(1)
	}
	os.Exit(code)
}
