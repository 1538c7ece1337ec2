package shimv1

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/fileid"
)

// A spare shim is a shim binary started before its session: `BINARY spare`,
// in a session of its own with only PATH of the environment, as Launch
// starts a shim, that waits on FDSpare (its end of a socket pair with the
// supervisor) for what Launch would have given it: the arguments of serve,
// and the files (stdin, stdout and stderr, the listener, the ready pipe) as
// rights. It puts the files in place and goes on as that serve. A cold start
// that finds a spare does not wait for a process and a Go runtime to start
// (~6 ms here, of page faults; the rest of the shim's start, reading the
// record and writing bootstrap.json, is the session's and stays). A spare
// holds nothing of any session or agent until it is handed one. It exits
// when the supervisor's end closes (the supervisor stopped, died or
// re-executed itself), so a spare never outlives the process that can hand
// it a session.
const FDSpare = 3

// spareFiles is how many files a spare is handed: FDReady + 1.
const spareFiles = FDReady + 1

// maxSpareMessage bounds the arguments a spare reads.
const maxSpareMessage = 64 << 10

// titleRoom is a spare's last argument, room in its argument area for the
// serve it becomes to be what ps shows (shim's setTitle): a session
// directory and a socket path under a home of up to ~200 bytes.
var titleRoom = strings.Repeat(" ", 512)

// spareMessage is what a spare is handed besides its files.
type spareMessage struct {
	Args []string `json:"args"`
}

// Spare is a started spare shim, the caller's child.
type Spare struct {
	Binary string
	PID    int
	// binary is Binary's identity when the spare started: a spare of a
	// binary since replaced (an upgrade) is not handed a session.
	binary fileid.ID
	conn   *net.UnixConn
	gone   <-chan struct{}
}

// StartSpare starts a spare of binary. The caller reaps it (Reap runs from
// here) and ends it with Discard, or hands it a session through Launch.
func StartSpare(binary string) (_ *Spare, retErr error) {
	id, err := fileid.Of(binary)
	if err != nil {
		return nil, fmt.Errorf("start a spare shim: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("start a spare shim: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "spare"), os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	c, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("start a spare shim: %w", err)
	}
	conn := c.(*net.UnixConn)
	defer func() {
		if retErr != nil {
			conn.Close()
		}
	}()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	files := make([]*os.File, FDSpare+1)
	files[0], files[1], files[2], files[FDSpare] = devnull, devnull, devnull, theirs
	p, err := os.StartProcess(binary, []string{filepath.Base(binary), "spare", titleRoom},
		&os.ProcAttr{Env: []string{"PATH=" + os.Getenv("PATH")}, Files: files, Sys: &syscall.SysProcAttr{Setsid: true}})
	if err != nil {
		return nil, fmt.Errorf("start a spare shim: %w", err)
	}
	pid := p.Pid
	p.Release() // this process reaps it, not os.Process
	return &Spare{Binary: binary, PID: pid, binary: id, conn: conn, gone: Reap(pid)}, nil
}

// Usable reports whether the spare may be handed a session: it still runs,
// and its binary is the one at its path now.
func (sp *Spare) Usable() bool {
	select {
	case <-sp.gone:
		return false
	default:
	}
	return fileid.Unchanged(sp.binary)
}

// Discard ends a spare that was not handed a session: its end of the pair
// closes, on which it exits; one that does not exit at once is killed. It
// returns once the spare is reaped.
func (sp *Spare) Discard() {
	sp.conn.Close()
	select {
	case <-sp.gone:
	case <-time.After(time.Second):
		syscall.Kill(sp.PID, syscall.SIGKILL)
		<-sp.gone
	}
}

// hand gives the spare what Launch gives a shim it starts: args (the
// program name first) and files (stdin, stdout, stderr, FDListener,
// FDReady). The pair is closed after, whatever the outcome: a spare serves
// one session or none.
func (sp *Spare) hand(args []string, files []*os.File) error {
	defer sp.conn.Close()
	if len(files) != spareFiles {
		return fmt.Errorf("hand %d files to a spare shim, want %d", len(files), spareFiles)
	}
	msg, err := json.Marshal(spareMessage{Args: args})
	if err != nil {
		return err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err = sp.conn.WriteMsgUnix(msg, unix.UnixRights(fds...), nil)
	if err != nil {
		return fmt.Errorf("hand the session to the spare shim (pid %d): %w", sp.PID, err)
	}
	return nil
}

// AwaitLaunch is a spare's side: it waits on FDSpare for its session, puts
// the files it is handed at stdin, stdout, stderr, FDListener and FDReady
// (FDSpare's place: the pair is closed by then), and returns the arguments
// of serve (without the program name). It returns nil, nil when the
// supervisor's end closed with no session handed.
func AwaitLaunch() ([]string, error) {
	buf := make([]byte, maxSpareMessage)
	oob := make([]byte, unix.CmsgSpace(spareFiles*4))
	var n, oobn, flags int
	var err error
	for {
		n, oobn, flags, _, err = unix.Recvmsg(FDSpare, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("spare shim: wait for a session: %w", err)
	}
	if n == 0 && oobn == 0 {
		return nil, nil
	}
	got, err := rights(oob[:oobn])
	defer func() {
		for _, fd := range got {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return nil, err
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return nil, errors.New("spare shim: the session's message was cut short")
	}
	if len(got) != spareFiles {
		return nil, fmt.Errorf("spare shim: handed %d files, want %d", len(got), spareFiles)
	}
	var msg spareMessage
	if err := json.Unmarshal(buf[:n], &msg); err != nil {
		return nil, fmt.Errorf("spare shim: the session's message: %w", err)
	}
	if len(msg.Args) < 2 {
		return nil, errors.New("spare shim: handed no command")
	}
	// A handed file may have landed on a place another one goes to: all
	// move above the places first.
	high := make([]int, len(got))
	for i, fd := range got {
		if high[i], err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, spareFiles); err != nil {
			return nil, fmt.Errorf("spare shim: take the handed files: %w", err)
		}
	}
	for _, fd := range got {
		unix.Close(fd)
	}
	got = high
	for i, fd := range got {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return nil, fmt.Errorf("spare shim: place the handed files: %w", err)
		}
	}
	return msg.Args[1:], nil
}

// rights returns the descriptors in a message's control data.
func rights(oob []byte) ([]int, error) {
	cmsgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("spare shim: the handed files: %w", err)
	}
	var fds []int
	for _, c := range cmsgs {
		r, err := unix.ParseUnixRights(&c)
		if err != nil {
			return nil, fmt.Errorf("spare shim: the handed files: %w", err)
		}
		fds = append(fds, r...)
	}
	return fds, nil
}
