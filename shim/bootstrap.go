package shim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
)

// defaultReadyTimeout bounds how long the bootstrap waits for the serving
// shim: it only has to read session.json and write bootstrap.json, unless
// it is warm (then the supervisor gives it longer).
const defaultReadyTimeout = 10 * time.Second

// The serving shim's inherited files.
const (
	fdListener = 3
	fdReady    = 4
)

// bootstrap listens on the socket, starts the long-lived shim with the
// listener, waits for it to be ready and prints where it is.
func bootstrap(dir, socket string, readyTimeout time.Duration, stdout io.Writer) (retErr error) {
	os.Remove(socket) // a leftover of a shim that died; a live one has its own run number
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the serving shim owns the socket file now
	defer l.Close()
	defer func() {
		if retErr != nil {
			os.Remove(socket)
		}
	}()
	if err := os.Chmod(socket, 0o600); err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	lf, err := ul.File()
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socket, err)
	}
	defer lf.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	logFile, err := os.OpenFile(dir+"/shim.log", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		readyW.Close()
		return fmt.Errorf("open shim log: %w", err)
	}
	defer logFile.Close()

	cmd := exec.Command("/proc/self/exe", "serve", "--session-dir", dir, "--socket", socket)
	cmd.Args[0] = "agentconnect-shim"
	cmd.ExtraFiles = []*os.File{lf, readyW} // fds 3 and 4
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own session and process group: a signal to the supervisor's group
	// (Ctrl-C in a terminal, systemd's stop) never reaches it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return fmt.Errorf("start shim: %w", err)
	}
	defer func() {
		if retErr != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	ready, err := readReady(readyR, readyTimeout)
	if err != nil {
		return err
	}
	if ready.Error != "" {
		return errors.New(ready.Error)
	}
	ready.Address = socket
	// The serving shim is not waited for: this process exits and it is
	// reparented, which is the point.
	cmd.Process.Release()
	return json.NewEncoder(stdout).Encode(ready)
}

func readReady(r *os.File, timeout time.Duration) (shimv1.Ready, error) {
	r.SetReadDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(r).ReadBytes('\n')
	if err != nil {
		return shimv1.Ready{}, fmt.Errorf("shim did not report ready: %w (see shim.log in the session directory)", err)
	}
	var ready shimv1.Ready
	if err := json.Unmarshal(line, &ready); err != nil {
		return shimv1.Ready{}, fmt.Errorf("shim ready message: %w", err)
	}
	return ready, nil
}
