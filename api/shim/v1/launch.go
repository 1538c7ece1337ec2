package shimv1

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The files a serving shim inherits from the process that launches it: the
// listener of its socket, and the pipe on which it reports Ready once it
// serves (or why it cannot).
const (
	FDListener = 3
	FDReady    = 4
)

// Launch starts `BINARY serve` for the session run whose directory is dir,
// listening on socket: the supervisor's side of a shim's bootstrap. The shim
// runs in a session of its own (setsid: a signal to the supervisor's group
// never reaches it), with only PATH of the caller's environment (it needs
// nothing else, and must not take a daemon's systemd variables,
// NOTIFY_SOCKET or LISTEN_FDS), the listener as FDListener, and its stdout and stderr appended to dir's
// shim.log. Launch returns once the shim reports ready on FDReady; when it
// reports an error, exits first, or ctx ends, the shim is killed and reaped
// and the socket removed before Launch returns why.
//
// The shim is the caller's child and is reaped when it exits, by a pidfd in
// the Go runtime's poller, so that no thread waits through a session's
// hours. Should the caller die first, the shim is reparented (to the
// nearest subreaper, or init) and lives on. (Until 2026-12 a bootstrap
// process, `agentconnect-shim start`, forked the shim and exited, as
// containerd's shim v2 does: its Go start cost ~2 ms of every start.)
//
// A spare of binary (StartSpare), when there is one, is handed the session
// instead of a new process being started; one that cannot take it (it
// exited, its binary was replaced) is discarded and a new process starts
// as without it. Ready.Spare says which it was.
func Launch(ctx context.Context, binary, dir, socket string, spare *Spare) (_ Ready, retErr error) {
	os.Remove(socket) // a leftover of a shim that died; a live one has its own run number
	l, err := net.Listen("unix", socket)
	if err != nil {
		return Ready{}, fmt.Errorf("listen on %s: %w", socket, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the shim owns the socket file once it serves
	defer l.Close()
	defer func() {
		if retErr != nil {
			os.Remove(socket)
		}
	}()
	if err := os.Chmod(socket, 0o600); err != nil {
		return Ready{}, fmt.Errorf("listen on %s: %w", socket, err)
	}
	lf, err := ul.File()
	if err != nil {
		return Ready{}, fmt.Errorf("listen on %s: %w", socket, err)
	}
	defer lf.Close()
	logFile, err := os.OpenFile(filepath.Join(dir, "shim.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return Ready{}, fmt.Errorf("open shim log: %w", err)
	}
	defer logFile.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return Ready{}, err
	}
	defer devnull.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return Ready{}, err
	}
	defer readyR.Close()

	files := make([]*os.File, FDReady+1)
	files[0], files[1], files[2] = devnull, logFile, logFile
	files[FDListener], files[FDReady] = lf, readyW
	args := []string{filepath.Base(binary), "serve", "--session-dir", dir, "--socket", socket}
	pid, gone, spared, err := startShim(binary, args, files, spare)
	readyW.Close()
	if err != nil {
		return Ready{}, err
	}

	stop := context.AfterFunc(ctx, func() { readyR.SetReadDeadline(aLongTimeAgo) })
	defer stop()
	ready, err := readReady(readyR)
	if err == nil && ready.Error != "" {
		err = errors.New(ready.Error)
	}
	if err == nil && ready.PID != pid {
		err = fmt.Errorf("shim (pid %d) reported ready as pid %d", pid, ready.PID)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("shim did not report ready: %w (see shim.log in the session directory)", context.Cause(ctx))
		}
		syscall.Kill(pid, syscall.SIGKILL)
		<-gone
		return Ready{}, err
	}
	ready.Address, ready.Spare = socket, spared
	return ready, nil
}

// startShim hands args and files to spare when it can take them, and
// otherwise starts binary with them. It returns the shim's pid, the
// channel Reap closes once it is reaped, and whether it was the spare.
func startShim(binary string, args []string, files []*os.File, spare *Spare) (int, <-chan struct{}, bool, error) {
	if spare != nil {
		if spare.Binary == binary && spare.Usable() && spare.hand(args, files) == nil {
			return spare.PID, spare.gone, true, nil
		}
		spare.Discard()
	}
	p, err := os.StartProcess(binary, args,
		&os.ProcAttr{Env: []string{"PATH=" + os.Getenv("PATH")}, Files: files, Sys: &syscall.SysProcAttr{Setsid: true}})
	if err != nil {
		return 0, nil, false, fmt.Errorf("start shim: %w", err)
	}
	pid := p.Pid
	p.Release() // this process reaps it, not os.Process
	return pid, Reap(pid), false, nil
}

// aLongTimeAgo is a deadline that has passed: it ends a read at once.
var aLongTimeAgo = time.Unix(1, 0)

func readReady(r *os.File) (Ready, error) {
	line, err := bufio.NewReader(r).ReadBytes('\n')
	if err != nil {
		return Ready{}, fmt.Errorf("shim did not report ready: %w (see shim.log in the session directory)", err)
	}
	var ready Ready
	if err := json.Unmarshal(line, &ready); err != nil {
		return Ready{}, fmt.Errorf("shim ready message: %w", err)
	}
	return ready, nil
}

// Reap reaps pid, a child of this process, once it exits, and closes the
// channel it returns then. A pidfd becomes readable when its process exits:
// the runtime's poller waits for that, where a wait would hold a thread
// through a session's hours. Without pidfds (Linux before 5.3), a goroutine
// waits in wait4. A supervisor that re-executes itself keeps its pid, and
// its shims as children: the new image reaps them with this too.
func Reap(pid int) <-chan struct{} {
	gone := make(chan struct{})
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	go func() {
		defer close(gone)
		var ws syscall.WaitStatus
		if err == nil {
			f := os.NewFile(uintptr(fd), "pidfd")
			defer f.Close()
			if rc, err := f.SyscallConn(); err == nil {
				err = rc.Read(func(uintptr) bool {
					wpid, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
					return wpid == pid || (err != nil && err != syscall.EINTR)
				})
				if err == nil {
					return
				}
			}
		}
		for {
			if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
				return
			}
		}
	}()
	return gone
}
