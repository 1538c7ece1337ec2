package vmagent

import (
	"os"
	"syscall"
)

// dockerdPaths are where an image may have Docker Engine: Debian's
// docker.io puts it in /usr/sbin, Docker's own packages in /usr/bin.
var dockerdPaths = []string{"/usr/sbin/dockerd", "/usr/bin/dockerd"}

// dockerLog is where dockerd writes, in the VM's own (overlay) root.
const dockerLog = "/var/log/dockerd.log"

// startDocker starts Docker Engine in the switched root when the image has
// it and the VM has its docker disk (mounted at /var/lib/docker), so that a
// session finds /var/run/docker.sock without starting a daemon of its own
// (which needs root). It runs in a session of its own; PID 1's reaper reaps
// it. Nothing waits for it: `docker info` answers once it is up (a few
// seconds under TCG).
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
	p, err := os.StartProcess(dockerd, []string{"dockerd", "--group", "docker"}, &os.ProcAttr{
		Dir:   "/",
		Env:   []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Files: []*os.File{null, log, log},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		logf("docker: start %s: %v", dockerd, err)
		return
	}
	logf("docker: dockerd started (pid %d), its log in %s", p.Pid, dockerLog)
	p.Release()
}
