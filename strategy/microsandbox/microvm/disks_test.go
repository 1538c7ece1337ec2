package microvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentconnect-md/agentconnect/api/session"
)

// execRunner runs a command with os/exec: this test has no reaper.
func execRunner(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}

func TestPrepareDisks(t *testing.T) {
	if _, err := exec.LookPath("mke2fs"); err != nil {
		t.Skip("mke2fs (e2fsprogs) is not installed")
	}
	c := Config{VM: session.VM{Dir: filepath.Join(t.TempDir(), "vm"), DiskGiB: 10}}
	if fresh, err := PrepareDisks(c, execRunner); err != nil || !fresh {
		t.Fatalf("new disks: fresh %v, %v; want fresh", fresh, err)
	}
	for _, d := range []string{DiskUpper, DiskDocker} {
		path := filepath.Join(c.Dir, d+".img")
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != 10<<30 {
			t.Errorf("%s: size %d, want 10 GiB", d, fi.Size())
		}
		// Sparse: far less on disk than its size.
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 > 256<<20 {
			t.Errorf("%s uses %d MiB on disk, want a sparse file", d, st.Blocks*512>>20)
		}
		out, err := exec.Command("dumpe2fs", "-h", path).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "Filesystem volume name:   "+d) {
			t.Errorf("%s is not an ext4 filesystem labelled %s: %v\n%s", d, d, err, out)
		}
	}
	// Existing disks are kept, untouched.
	marker := filepath.Join(c.Dir, DiskUpper+".img")
	before, _ := os.Stat(marker)
	if fresh, err := PrepareDisks(c, execRunner); err != nil || fresh {
		t.Fatalf("existing disks: fresh %v, %v; want not fresh", fresh, err)
	}
	after, _ := os.Stat(marker)
	if !after.ModTime().Equal(before.ModTime()) {
		t.Error("PrepareDisks rewrote an existing disk")
	}
	if _, err := PrepareDisks(Config{VM: session.VM{Dir: t.TempDir(), DiskGiB: 0}}, execRunner); err == nil {
		t.Error("diskGiB 0 accepted")
	}
}
