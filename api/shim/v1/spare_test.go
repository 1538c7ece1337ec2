package shimv1

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMain lets the test binary stand for a shim: started as `spare`, it
// waits for its session the way agentconnect-shim does (AwaitLaunch), and
// started as `serve` (or handed a serve), it prints what it was given to
// stdout (the session's shim.log), reports ready and waits to be killed.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "spare" || os.Args[1] == "serve") {
		os.Exit(testShim(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func testShim(args []string) int {
	if args[0] == "spare" {
		var err error
		if args, err = AwaitLaunch(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if args == nil {
			return 0 // the supervisor's end closed: no session
		}
	}
	var st unix.Stat_t
	listener := unix.Fstat(FDListener, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
	fmt.Printf("args=%s\nlistener=%v\n", strings.Join(args, " "), listener)
	for _, kv := range os.Environ() {
		fmt.Println("env", kv)
	}
	json.NewEncoder(os.NewFile(FDReady, "ready")).Encode(Ready{PID: os.Getpid(), StartTime: 7})
	time.Sleep(time.Minute)
	return 0
}

// testBinary is a copy of the test binary in dir, so that a test can
// replace it.
func testBinary(t *testing.T, dir string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "shim")
	copyFile(t, self, path)
	return path
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	tmp := to + ".tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// A spare handed a session is the shim: Launch starts no process, and the
// spare serves with what a launched shim gets (the serve's arguments, the
// listener, shim.log, only PATH, a session of its own).
func TestSpareTakesTheLaunch(t *testing.T) {
	dir := t.TempDir()
	bin := testBinary(t, dir)
	t.Setenv("SPARE_TEST_MARKER", "must-not-reach-the-shim")
	sp, err := StartSpare(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(sp.PID, syscall.SIGKILL); gone(t, sp.PID) }()
	socket := filepath.Join(dir, "shim.sock")
	ready, err := Launch(context.Background(), bin, dir, socket, sp)
	if err != nil {
		t.Fatal(err)
	}
	if !ready.Spare || ready.PID != sp.PID || ready.Address != socket {
		t.Fatalf("Ready = %+v, want the spare's (pid %d) at %s", ready, sp.PID, socket)
	}
	if sid, err := unix.Getsid(sp.PID); err != nil || sid != sp.PID {
		t.Errorf("the spare's session = %d, %v; want its own (%d)", sid, err, sp.PID)
	}
	var log []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if log, _ = os.ReadFile(filepath.Join(dir, "shim.log")); strings.Contains(string(log), "env PATH=") {
			break
		}
	}
	want := fmt.Sprintf("args=serve --session-dir %s --socket %s\nlistener=true\n", dir, socket)
	if !strings.HasPrefix(string(log), want) || strings.Contains(string(log), "SPARE_TEST_MARKER") {
		t.Errorf("shim.log = %q; want it to begin with %q, and no variable but PATH", log, want)
	}
}

// A spare whose supervisor's end closes exits by itself.
func TestSpareExitsWithoutItsSupervisor(t *testing.T) {
	sp, err := StartSpare(testBinary(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	sp.conn.Close() // not Discard: that would kill a spare that stays
	select {
	case <-sp.gone:
	case <-time.After(10 * time.Second):
		syscall.Kill(sp.PID, syscall.SIGKILL)
		t.Fatal("the spare did not exit once its supervisor's end closed")
	}
}

// A spare that cannot take a session (it died; its binary was replaced
// since it started) is not handed one: Launch starts the binary as it is,
// and the spare is gone.
func TestSpareNotUsable(t *testing.T) {
	for _, c := range []struct {
		name  string
		spoil func(t *testing.T, sp *Spare, bin string)
	}{
		{"died", func(t *testing.T, sp *Spare, _ string) {
			syscall.Kill(sp.PID, syscall.SIGKILL)
			<-sp.gone
		}},
		{"binary replaced", func(t *testing.T, _ *Spare, bin string) {
			copyFile(t, bin, bin+".new")
			if err := os.Rename(bin+".new", bin); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin := testBinary(t, dir)
			sp, err := StartSpare(bin)
			if err != nil {
				t.Fatal(err)
			}
			c.spoil(t, sp, bin)
			ready, err := Launch(context.Background(), bin, dir, filepath.Join(dir, "shim.sock"), sp)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { syscall.Kill(ready.PID, syscall.SIGKILL); gone(t, ready.PID) }()
			if ready.Spare || ready.PID == sp.PID {
				t.Errorf("Ready = %+v: the spare (pid %d) was handed the session", ready, sp.PID)
			}
			gone(t, sp.PID)
		})
	}
}

// A spare started from a binary that is not there is an error naming it.
func TestSpareMissingBinary(t *testing.T) {
	_, err := StartSpare(filepath.Join(t.TempDir(), "no-such-shim"))
	if err == nil || !strings.Contains(err.Error(), "no-such-shim") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("StartSpare = %v, want an error naming the missing binary", err)
	}
}
