package shim

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
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/internal/inject/handoff"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// injectReadyTimeout bounds waiting for agentconnect-inject's CA.
const injectReadyTimeout = 10 * time.Second

// Injector is a run's agentconnect-inject process, as the boundary's
// network (srt's proxy, a VM's network stack) sees it: the hosts the run's
// secrets are bound to, and the socket each of their connections is handed
// over on.
type Injector struct {
	h      *Host
	sender *handoff.Sender
	hosts  []*netpolicy.Binding
	pid    int
	log    *logrus.Entry
}

// StartInjector starts agentconnect-inject (beside this shim) for the run's
// secrets (Secrets, which it must have), through the shim's reaper so that
// it dies with the shim, and returns it with its session CA's certificate.
// trustedPEM, if set, verifies the bound hosts besides the system's store.
// The values travel on its stdin only. Stop it when the run ends.
func (h *Host) StartInjector(trustedPEM string) (_ *Injector, caPEM []byte, retErr error) {
	cfg := handoff.Config{RootCAsPEM: trustedPEM}
	in := &Injector{h: h, log: h.Log()}
	for _, s := range h.Secrets() {
		// Its token hosts are bound too: the refresh goes there.
		b, err := netpolicy.NewBinding(append(slices.Clone(s.Hosts), s.TokenHosts...))
		if err != nil {
			return nil, nil, fmt.Errorf("secret hosts: %w", err)
		}
		in.hosts = append(in.hosts, b)
		cfg.Secrets = append(cfg.Secrets, handoff.Secret{Placeholder: s.Placeholder, Value: s.Value, Hosts: s.Hosts, Headers: s.Headers,
			TokenHosts: s.TokenHosts, TokenField: s.TokenField})
	}
	if len(cfg.Secrets) == 0 {
		return nil, nil, errors.New("an injector for a run without secrets")
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
	notStarted := func(err error) (*Injector, []byte, error) {
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
	pid, _, err := h.Spawn(path, []string{"agentconnect-inject"}, &os.ProcAttr{Files: []*os.File{stdinR, stdoutW, stderrW, theirs}}, nil)
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
			in.Stop()
		}
	}()
	go sender.ReadUpdates(func(u handoff.Update) { h.s.renew(u.Placeholder, u.Value) })
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

// Binds reports whether a secret is bound to host:port (netpolicy.Binding).
func (in *Injector) Binds(host string, port int) bool {
	for _, b := range in.hosts {
		if b.TLS(host, port) {
			return true
		}
	}
	return false
}

// Intercept hands a connection to port of the address hosts lead to (each
// bound) to the inject process; the caller then closes its own copies of
// the connections, which must have file descriptors.
func (in *Injector) Intercept(_ context.Context, client net.Conn, buffered []byte, upstream net.Conn, hosts []string, port int) {
	if err := in.sender.Send(handoff.Tunnel{Hosts: hosts, Port: port, Buffered: buffered}, client, upstream); err != nil {
		in.log.WithError(err).WithField("host", net.JoinHostPort(strings.Join(hosts, ","), fmt.Sprint(port))).Warn("hand a connection to agentconnect-inject")
	}
}

// Stop closes the handoff socket, on which the inject process exits; a
// process that is still there a moment later is killed.
func (in *Injector) Stop() {
	in.sender.Close()
	go func() {
		time.Sleep(2 * time.Second)
		in.h.Signal(in.pid, syscall.SIGKILL) // a no-op once it has been reaped
	}()
}
