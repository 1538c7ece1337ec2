package vmagent

import (
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// dockerdPaths are where an image may have Docker Engine: Debian's
// docker.io puts it in /usr/sbin, Docker's own packages in /usr/bin.
var dockerdPaths = []string{"/usr/sbin/dockerd", "/usr/bin/dockerd"}

const (
	// dockerSocket is where the docker CLI looks (/var/run is /run).
	dockerSocket = "/run/docker.sock"
	// dockerLog is where dockerd writes, in the VM's own (overlay) root.
	dockerLog = "/var/log/dockerd.log"
)

// startDocker makes Docker Engine available in the switched root when the
// image has it and the VM has its docker disk (mounted at /var/lib/docker):
// it listens on the docker socket, as systemd's docker.socket does, and
// starts dockerd with that socket (-H fd://) on the first connection. A VM
// that never uses Docker never pays for it: dockerd and containerd starting
// under TCG doubled an idle VM's memory (517 against 276 MiB PSS at 512 MiB)
// and slowed the runtime's start beside it. The first docker command waits
// the few seconds dockerd takes. PID 1's reaper reaps dockerd.
func startDocker(logf func(string, ...any)) {
	dockerd := ""
	for _, p := range dockerdPaths {
		if _, err := os.Stat(p); err == nil {
			dockerd = p
			break
		}
	}
	if dockerd == "" {
		return
	}
	os.Remove(dockerSocket)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: dockerSocket, Net: "unix"})
	if err != nil {
		logf("docker: listen on %s: %v", dockerSocket, err)
		return
	}
	l.SetUnlinkOnClose(false)
	// root:docker 0660, as docker.socket has it.
	if gid, ok := groupID("/etc/group", "docker"); ok {
		os.Chown(dockerSocket, 0, gid)
	}
	os.Chmod(dockerSocket, 0o660)
	sock, err := l.File() // a blocking duplicate, to hand over
	l.Close()
	if err != nil {
		logf("docker: %v", err)
		return
	}
	go func() {
		defer sock.Close()
		fds := []unix.PollFd{{Fd: int32(sock.Fd()), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != unix.EINTR {
				break
			}
		}
		runDockerd(dockerd, sock, logf)
	}()
	logf("docker: listening on %s; dockerd starts on the first connection", dockerSocket)
}

// runDockerd starts dockerd on the listening socket sock, passed as fd 3
// by socket activation: the shell exports its own pid as LISTEN_PID and
// execs dockerd in its place, so the pid matches.
func runDockerd(dockerd string, sock *os.File, logf func(string, ...any)) {
	log, err := os.OpenFile(dockerLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		logf("docker: %v", err)
		return
	}
	defer log.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		logf("docker: %v", err)
		return
	}
	defer null.Close()
	p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" -H fd:// --group docker`, dockerd}, &os.ProcAttr{
		Dir:   "/",
		Env:   []string{"PATH=" + defaultPath},
		Files: []*os.File{null, log, log, sock},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		logf("docker: start %s: %v", dockerd, err)
		return
	}
	logf("docker: dockerd started on the first connection (pid %d), its log in %s", p.Pid, dockerLog)
	p.Release()
}
