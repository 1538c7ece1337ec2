// Command agentconnect-vmimage prepares the microsandbox strategy's guest
// images for the daemon: `agentconnect-vmimage image` reads a request as JSON
// on stdin (api/helper) and answers with the default image, or a custom one
// pulled or read, turned into a root filesystem and cached by digest. It is a
// binary of its own because the registry code (go-containerregistry,
// net/http, crypto/tls) would otherwise be in every VM's shim: 2.2 MiB of
// RSS each (docs/design-notes.md).
package main

import (
	"fmt"
	"os"

	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmimage/custom"
)

const usage = `usage: agentconnect-vmimage image < REQUEST.json

The daemon runs it to find or prepare a microsandbox guest image; a person
does not need to. The request and the answer are JSON (api/helper):
  {"imageDir": DIR, "imagesDir": CACHE, "ref": REFERENCE}
  -> {"kernel", "initrd", "rootfs", "digest"} or {"error"}`

func main() {
	if len(os.Args) != 2 || os.Args[1] != "image" {
		if len(os.Args) == 2 && (os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help") {
			fmt.Println(usage)
			return
		}
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err := custom.ImageMain(os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agentconnect-vmimage:", err)
		os.Exit(1)
	}
}
