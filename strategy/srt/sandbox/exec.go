package sandbox

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/execmsg"
	"github.com/agentconnect-md/agentconnect/internal/protect"
)

// writeAccess is every Landlock right that changes the filesystem: the
// layer below restricts writing to the writable roots and leaves reading to
// the mount view.
const writeAccess = llsys.AccessFSWriteFile | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile |
	llsys.AccessFSMakeChar | llsys.AccessFSMakeDir | llsys.AccessFSMakeReg | llsys.AccessFSMakeSock |
	llsys.AccessFSMakeFifo | llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym | llsys.AccessFSRefer |
	llsys.AccessFSTruncate

// ExitSetupFailed is sandbox-exec's exit code when the sandbox could not be
// completed; the reason goes to FDExecError.
const ExitSetupFailed = 125

// Exec is `agentconnect-shim sandbox-exec`, the last step inside the
// sandbox, already under the seccomp filter bwrap applied: it checks that
// every protected bind landed where it should (protect.Verify), gives the
// runtime its stderr, restricts writes with Landlock, opens the proxy
// listeners on the sandbox's loopback and hands them to the shim (so no
// process of ours stays inside; the shim's sign that the sandbox is up),
// then waits for the runtime's command and
// environment on FDExec (sent as soon as the sandbox is up for a cold start;
// when a session claims it, for a warm one) and execs it. It returns only
// on failure, after reporting it on FDExecError.
func Exec(args []string) error {
	fs := flag.NewFlagSet("sandbox-exec", flag.ContinueOnError)
	var listen, writable multiFlag
	fs.Var(&listen, "listen", "an address to listen on for the proxy (repeatable)")
	fs.Var(&writable, "writable", "a directory Landlock leaves writable (repeatable; none: no Landlock)")
	if err := fs.Parse(args); err != nil {
		return fail(ExitSetupFailed, -1, "sandbox setup: "+err.Error())
	}
	if fs.NArg() > 0 {
		return fail(ExitSetupFailed, -1, fmt.Sprintf("sandbox setup: sandbox-exec takes no command (it comes on fd %d), got %q", FDExec, fs.Args()))
	}
	checks, err := protect.ReadChecks(FDChecks)
	if err == nil {
		err = protect.Verify(checks)
	}
	if err != nil {
		return fail(ExitSetupFailed, -1, "sandbox setup: "+err.Error())
	}
	if err := unix.Dup3(FDStderr, 2, 0); err != nil {
		return fail(ExitSetupFailed, -1, "sandbox setup: stderr: "+err.Error())
	}
	unix.Close(FDStderr)
	if len(writable) > 0 {
		if err := restrictWrites(writable); err != nil {
			return fail(ExitSetupFailed, -1, "sandbox setup: landlock: "+err.Error())
		}
	}
	// The last step of the setup: the shim takes the sandbox as ready once
	// it has the listeners, and a claim's command should find nothing left
	// to do but its exec. (Landlock restricts only the filesystem here, so
	// the listeners can be made under it.)
	if err := handOverListeners(listen); err != nil {
		return fail(ExitSetupFailed, -1, "sandbox setup: proxy listeners: "+err.Error())
	}
	execFile := os.NewFile(FDExec, "exec")
	m, err := execmsg.Receive(execFile)
	execFile.Close() // the runtime inherits no fd of ours
	if errors.Is(err, execmsg.ErrNone) {
		// The shim gave the sandbox up (a warm one discarded): no report.
		os.Exit(ExitSetupFailed)
	}
	if err != nil {
		return fail(ExitSetupFailed, -1, "sandbox setup: "+err.Error())
	}
	unix.CloseOnExec(FDExecError)
	code, err := execmsg.Exec(m)
	return fail(code, code, err.Error())
}

// fail reports "CODE message" to the shim and exits.
func fail(exit, code int, msg string) error {
	fmt.Fprintf(os.NewFile(FDExecError, "exec-error"), "%d %s", code, msg)
	fmt.Fprintln(os.Stderr, "agentconnect:", msg)
	os.Exit(exit)
	return nil
}

// handOverListeners listens on each address and sends the listening
// sockets to the shim with SCM_RIGHTS, naming them in the message body.
func handOverListeners(addrs []string) error {
	defer unix.Close(FDListeners)
	var fds []int
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		f, err := l.(*net.TCPListener).File()
		l.Close()
		if err != nil {
			return err
		}
		defer f.Close()
		fds = append(fds, int(f.Fd()))
	}
	return unix.Sendmsg(FDListeners, []byte(strings.Join(addrs, "\n")), unix.UnixRights(fds...), nil, 0)
}

// restrictWrites lets this process and what it execs write only beneath
// the given directories. A kernel without Landlock stops the start (the
// probe says so first); an older Landlock enforces the rights it knows
// (every ABI restricts writing files and making entries; later ones add
// truncation and renames across directories).
func restrictWrites(dirs []string) error {
	if abi, err := llsys.LandlockGetABIVersion(); err != nil || abi < 1 {
		return fmt.Errorf("the kernel does not offer Landlock (ABI %d, %v)", abi, err)
	}
	cfg := landlock.Config{HandledAccessFS: writeAccess}
	return cfg.BestEffort().RestrictPaths(landlock.PathAccess(writeAccess, dirs...).IgnoreIfMissing())
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
