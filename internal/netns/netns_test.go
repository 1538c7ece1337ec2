package netns

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestDo: fn runs in the other namespace (a new one has only a loopback,
// down), its error comes back, and the caller's namespace is as it was.
func TestDo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering another network namespace needs root")
	}
	cmd := exec.Command("unshare", "--net", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("unshare: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// unshare makes the namespace, then execs sleep in it.
	var self, st syscall.Stat_t
	syscall.Stat("/proc/self/ns/net", &self)
	path := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
	for i := 0; i < 200 && (syscall.Stat(path, &st) != nil || st.Ino == self.Ino); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if st.Ino == self.Ino {
		t.Fatal("the namespace did not come up")
	}
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	before, _ := net.Interfaces()
	var inside []net.Interface
	err = Do(int(ns.Fd()), func() error {
		var err error
		inside, err = net.Interfaces()
		return err
	})
	if err != nil || len(inside) != 1 || inside[0].Name != "lo" {
		t.Fatalf("interfaces inside: %v, %v; want lo alone", inside, err)
	}
	after, _ := net.Interfaces()
	if len(after) != len(before) || len(before) < 2 {
		t.Errorf("interfaces outside: %d before, %d after", len(before), len(after))
	}
	want := errors.New("fn's own")
	if err := Do(int(ns.Fd()), func() error { return want }); err != want {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	if err := Do(-1, func() error { return nil }); err == nil {
		t.Error("Do entered no namespace and said nothing")
	}
}
