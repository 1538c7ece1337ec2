package srt

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/inject/handoff"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
	"github.com/agentconnect-md/agentconnect/shim"
)

// injectReadyTimeout bounds waiting for agentconnect-inject's CA.
const injectReadyTimeout = 10 * time.Second

// systemBundle is the host's trust store (Debian's ca-certificates).
const systemBundle = "/etc/ssl/certs/ca-certificates.crt"

// injector is a session's agentconnect-inject process, as the proxy sees
// it (proxy.Interceptor): the hosts its secrets are bound to, and the
// socket each of their tunnels is handed over on.
type injector struct {
	sender *handoff.Sender
	hosts  []*netpolicy.Policy
	pid    int
	log    *logrus.Entry
}

// startInjector starts agentconnect-inject (beside this shim) for the
// run's secrets, through the shim's reaper so that it dies with the shim,
// and returns it with its session CA's certificate. The values travel on
// its stdin only.
func startInjector(h *shim.Host, secrets []*shimv1.Secret, trustedPEM string) (_ *injector, caPEM []byte, retErr error) {
	cfg := handoff.Config{RootCAsPEM: trustedPEM}
	in := &injector{log: h.Log()}
	for _, s := range secrets {
		p, err := netpolicy.New(s.Hosts, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("secret hosts: %w", err)
		}
		in.hosts = append(in.hosts, p)
		cfg.Secrets = append(cfg.Secrets, handoff.Secret{Placeholder: s.Placeholder, Value: s.Value, Hosts: s.Hosts, Headers: s.Headers})
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(filepath.Dir(self), "agentconnect-inject")
	if _, err := os.Stat(path); err != nil {
		return nil, nil, fmt.Errorf("agentconnect-inject, which puts this session's secrets on the wire, is not installed beside %s (make install): %w", self, err)
	}
	sender, theirs, err := handoff.Pair()
	if err != nil {
		return nil, nil, err
	}
	in.sender = sender
	// The child's ends are closed once it holds them, or on an error
	// before; the shim's ends here only if it did not start.
	childEnds := []*os.File{theirs}
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	var ours []*os.File
	notStarted := func(err error) (*injector, []byte, error) {
		sender.Close()
		for _, f := range ours {
			f.Close()
		}
		return nil, nil, err
	}
	pipe := func(childReads bool) (child, mine *os.File, err error) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		if child, mine = w, r; childReads {
			child, mine = r, w
		}
		childEnds, ours = append(childEnds, child), append(ours, mine)
		return child, mine, nil
	}
	stdinR, stdinW, err := pipe(true)
	if err != nil {
		return notStarted(err)
	}
	stdoutW, stdoutR, err := pipe(false)
	if err != nil {
		return notStarted(err)
	}
	stderrW, stderrR, err := pipe(false)
	if err != nil {
		return notStarted(err)
	}
	pid, _, err := h.Spawn(path, []string{"agentconnect-inject"}, &os.ProcAttr{Files: []*os.File{stdinR, stdoutW, stderrW, theirs}})
	// Now, not at return: its stdout must end when it does.
	for _, f := range childEnds {
		f.Close()
	}
	childEnds = nil
	if err != nil {
		return notStarted(fmt.Errorf("start agentconnect-inject: %w", err))
	}
	in.pid = pid
	defer func() {
		if retErr != nil {
			in.stop(h)
		}
	}()
	go func() {
		sc := bufio.NewScanner(stderrR)
		for sc.Scan() {
			in.log.WithField("from", "agentconnect-inject").Warn(sc.Text())
		}
		stderrR.Close()
	}()
	data, err := json.Marshal(cfg)
	if err == nil {
		_, err = stdinW.Write(data)
	}
	stdinW.Close()
	if err != nil {
		stdoutR.Close()
		return nil, nil, fmt.Errorf("give agentconnect-inject its secrets: %w", err)
	}
	stdoutR.SetReadDeadline(time.Now().Add(injectReadyTimeout))
	var ready handoff.Ready
	err = json.NewDecoder(io.LimitReader(stdoutR, 1<<20)).Decode(&ready)
	stdoutR.Close()
	if err != nil || ready.CACertPEM == "" {
		return nil, nil, fmt.Errorf("agentconnect-inject did not start (%v): see the shim's log", err)
	}
	return in, []byte(ready.CACertPEM), nil
}

// Binds reports whether a secret is bound to host:port.
func (in *injector) Binds(host string, port int) bool {
	for _, p := range in.hosts {
		if p.CheckName(host, port).Allow {
			return true
		}
	}
	return false
}

// Intercept hands the tunnel to the inject process; the proxy then closes
// its own copies of the connections.
func (in *injector) Intercept(_ context.Context, client net.Conn, buffered []byte, upstream net.Conn, host string, port int) {
	if err := in.sender.Send(handoff.Tunnel{Host: host, Port: port, Buffered: buffered}, client, upstream); err != nil {
		in.log.WithError(err).WithField("host", net.JoinHostPort(host, fmt.Sprint(port))).Warn("hand a tunnel to agentconnect-inject")
	}
}

// stop closes the handoff socket, on which the inject process exits; a
// process that is still there a moment later is killed.
func (in *injector) stop(h *shim.Host) {
	in.sender.Close()
	go func() {
		time.Sleep(2 * time.Second)
		h.Signal(in.pid, syscall.SIGKILL) // a no-op once it has been reaped
	}()
}

// caBundle writes the sandbox's trust store into the session directory:
// the system's certificates and the session CA's. It is no secret.
func caBundle(dir string, caPEM []byte) (*os.File, error) {
	system, err := os.ReadFile(systemBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	path := filepath.Join(dir, "ca-bundle.pem")
	data := append(append(system, '\n'), caPEM...)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return nil, err
	}
	return os.Open(path)
}
