package sandbox

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary doubles as a process on a kernel without Landlock: a
// seccomp filter of its own makes landlock_create_ruleset fail with ENOSYS,
// as it does where the kernel lacks Landlock, then it tries restrictWrites.
func TestMain(m *testing.M) {
	if os.Getenv("SANDBOX_TEST_NO_LANDLOCK") == "1" {
		if err := denyLandlock(); err != nil {
			os.Stderr.WriteString("seccomp: " + err.Error())
			os.Exit(2)
		}
		if err := restrictWrites([]string{os.TempDir()}); err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// denyLandlock installs, on every thread, a filter answering
// landlock_create_ruleset with ENOSYS.
func denyLandlock() error {
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // the syscall number
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_LANDLOCK_CREATE_RULESET, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return errno
	}
	return nil
}

// Without Landlock, sandbox-exec refuses to run the runtime rather than
// run it with one layer less than srt promises.
func TestRestrictWritesFailsClosedWithoutLandlock(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "SANDBOX_TEST_NO_LANDLOCK=1")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "does not offer Landlock") {
		t.Errorf("restrictWrites on a kernel without Landlock: %v: %s; want a refusal naming Landlock", err, out)
	}
}
