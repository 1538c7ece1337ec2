package shim

import (
	"os"
	"strings"
	"unsafe"
)

// setTitle writes args over this process's argument area, which
// /proc/PID/cmdline and ps show, so that a spare that was handed a session
// reads as the serve it became. The area is the one the process started
// with (os.Args points into it, and a spare is started with room to spare:
// shimv1.StartSpare); what does not fit is cut. os.Args is set to args.
func setTitle(args []string) {
	if len(os.Args) == 0 {
		return
	}
	n := 0
	for _, a := range os.Args {
		n += len(a) + 1
	}
	area := unsafe.Slice(unsafe.StringData(os.Args[0]), n)
	off := 0
	for _, a := range os.Args {
		// The arguments lie one after the other, each ended by a NUL:
		// anything else is not the area this knows how to write.
		if len(a) > 0 && unsafe.StringData(a) != &area[off] {
			return
		}
		off += len(a) + 1
	}
	title := strings.Join(args, "\x00")
	os.Args = append([]string(nil), args...)
	clear(area)
	copy(area[:n-1], title)
}
