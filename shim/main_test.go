package shim

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary be the init it spawns ("/proc/self/exe
// init"), as agentconnect-shim is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		err := runInit(os.Args[2:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
