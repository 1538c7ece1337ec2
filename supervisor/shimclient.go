package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
	"github.com/agentconnect-md/agentconnect/internal/version"
	"github.com/agentconnect-md/agentconnect/strategy"
)

const (
	// bootstrapTimeout bounds a shim's bootstrap (shimv1.Launch): its start
	// until it reports ready.
	bootstrapTimeout = 15 * time.Second
	// warmBootstrapTimeout bounds it for a warm shim, which answers once
	// its run is prepared: for a VM, booted (the shim allows two minutes),
	// at background priority.
	warmBootstrapTimeout = 3 * time.Minute
	// dialTimeout bounds connecting to a shim and the handshake. A dead
	// socket fails at once (no listener: ECONNREFUSED), never the 100 s
	// containerd once paid; a live shim that was just started among
	// hundreds (500 srt sessions at once on 2 cores) took over 2 s to
	// answer its handshake.
	dialTimeout = 10 * time.Second
	// adoptTimeout is the shorter bound while the supervisor starts: a live
	// shim answers in milliseconds, and one that does not is tried again in
	// the background rather than hold up the start.
	adoptTimeout = 500 * time.Millisecond
	// callTimeout bounds a short call to a shim (State, Kill, Shutdown).
	callTimeout = 10 * time.Second
	// startTimeout bounds the Start call: longer than the shim's own bound
	// on a start (a VM's boot among it) by a short call, so that a slow
	// start ends with the shim's answer. A start that still has not
	// answered is abandoned, with everything it started.
	startTimeout = shimv1.StartTimeout + callTimeout
	// shimExitTimeout bounds the wait for a shim told to shut down to exit.
	shimExitTimeout = 5 * time.Second
)

// shimConn is a connection to one live shim.
type shimConn struct {
	client    *ttrpclite.Client
	shim      shimv1.ShimService
	pid       int
	startTime uint64
	address   string
	// apiVersion is the shim API version the shim speaks.
	apiVersion uint32
}

func (c *shimConn) close() { c.client.Close() }

// dialShim connects to the shim of boot and shakes hands, within timeout.
func dialShim(ctx context.Context, boot *session.Bootstrap, timeout time.Duration) (*shimConn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", boot.Address)
	if err != nil {
		return nil, fmt.Errorf("connect to shim (pid %d): %w", boot.PID, err)
	}
	client := ttrpclite.NewClient(conn)
	c := &shimConn{client: client, shim: shimv1.NewShimClient(client), pid: boot.PID, startTime: boot.StartTime, address: boot.Address}
	hs, err := c.shim.Handshake(ctx, &shimv1.HandshakeRequest{ApiVersion: shimv1.APIVersion, SupervisorVersion: version.Version})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("handshake with shim (pid %d): %w", boot.PID, err)
	}
	if hs.ApiVersion < shimv1.MinAPIVersion {
		client.Close()
		return nil, fmt.Errorf("shim (pid %d, release %s) speaks shim API %d; this release adopts %d and newer", boot.PID, hs.ShimVersion, hs.ApiVersion, shimv1.MinAPIVersion)
	}
	c.apiVersion = hs.ApiVersion
	return c, nil
}

// shimFor is the shim binary of a strategy's family: agentconnect-shim-vm
// for microsandbox, agentconnect-shim for the others.
func (s *Supervisor) shimFor(n strategy.Name) (string, error) {
	if n != strategy.Microsandbox {
		return s.opts.ShimBinary, nil
	}
	if s.opts.VMShimBinary == "" {
		return "", errdefs.FailedPrecondition("agentconnect-shim-vm, which runs microsandbox sessions, is not installed beside agentconnect (make install)")
	}
	return s.opts.VMShimBinary, nil
}

// fillSpare starts the spare shim of strategy n's binary, unless there is
// one (sparePool.fill).
func (s *Supervisor) fillSpare(n strategy.Name) {
	if shim, err := s.shimFor(n); err == nil {
		s.spares.fill(shim)
	}
}

// bootstrapShim starts the strategy's shim for a session run, listening on
// socket, and returns its bootstrap.json once it is ready (shimv1.Launch:
// a shim that is not ready within timeout, or when ctx ends, is killed),
// and whether it was a spare: with spare, the binary's spare shim is
// handed the run when there is one.
func (s *Supervisor) bootstrapShim(ctx context.Context, dir session.Dir, n strategy.Name, run uint32, socket string, timeout time.Duration, spare bool) (*session.Bootstrap, bool, error) {
	shim, err := s.shimFor(n)
	if err != nil {
		return nil, false, err
	}
	var sp *shimv1.Spare
	if spare {
		sp = s.spares.take(shim)
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("not ready after %v", timeout))
	defer cancel()
	ready, err := shimv1.Launch(ctx, shim, string(dir), socket, sp)
	if err != nil {
		return nil, false, fmt.Errorf("start shim: %w", err)
	}
	// bootstrap.json is the shim's own record; read it for the start time.
	boot, err := dir.ReadBootstrap()
	if err != nil || boot == nil || boot.PID != ready.PID || boot.Run != run {
		procstat.Kill(ready.PID, ready.StartTime, killWait)
		os.Remove(socket)
		return nil, false, fmt.Errorf("start shim: bootstrap.json does not name the shim (pid %d): %v", ready.PID, err)
	}
	return boot, ready.Spare, nil
}

// stopShim kills the shim of boot, once it is still that process, and
// waits until it is gone. Its runtime and helpers die with it (Pdeathsig,
// bwrap's --die-with-parent); what is left is in the run's cgroup.
func (s *Supervisor) stopShim(boot *session.Bootstrap) {
	if err := procstat.Kill(boot.PID, boot.StartTime, killWait); err != nil {
		s.log.WithError(err).WithField("shim", boot.PID).Warn("stop shim")
	}
}
