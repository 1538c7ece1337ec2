package shim

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// setTitle rewrites what /proc/PID/cmdline shows, within the room the
// process started with: a title that fits is there whole, NUL-separated
// and the rest cleared; a longer one is cut to the room.
func TestSetTitle(t *testing.T) {
	if title := os.Getenv("SHIM_TEST_SET_TITLE"); title != "" {
		setTitle(strings.Split(title, " "))
		data, _ := os.ReadFile("/proc/self/cmdline")
		os.Stdout.Write(data)
		os.Exit(0)
	}
	room := strings.Repeat(" ", 64)
	for _, c := range []struct{ title, want string }{
		{"agentconnect-shim serve --socket /s", "agentconnect-shim\x00serve\x00--socket\x00/s\x00"},
		{"x " + strings.Repeat("y", 4096), "x\x00yyy"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSetTitle$", room)
		cmd.Env = append(os.Environ(), "SHIM_TEST_SET_TITLE="+c.title)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%q: %v", c.title, err)
		}
		area := len(os.Args[0]) + len("-test.run=^TestSetTitle$") + len(room) + 3
		if !bytes.HasPrefix(out, []byte(c.want)) || len(out) != area {
			t.Errorf("cmdline after setTitle(%.40q) = %.80q (%d bytes), want it to begin with %q and fill the %d bytes of the area", c.title, out, len(out), c.want, area)
		}
		if rest := bytes.TrimLeft(out[len(c.want):], "y"); len(c.title) < area && strings.Trim(string(rest), "\x00") != "" {
			t.Errorf("cmdline after setTitle(%q) = %q: the old arguments are still there", c.title, out)
		}
	}
}
