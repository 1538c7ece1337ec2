package srt

import (
	"context"
	"errors"
	"net"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/netns"
)

// DialInside connects to port on the sandbox's loopback, for a forward from
// the host's: the connection's socket is made in the sandbox's network
// namespace (netns.Do). The shim may enter it: the sandbox's user
// namespace is the daemon user's.
func (r *srtRun) DialInside(ctx context.Context, port int) (net.Conn, error) {
	// A copy of its own: Stop may close the run's at any time.
	r.mu.Lock()
	nsFD := -1
	if r.netns != nil {
		nsFD, _ = unix.FcntlInt(r.netns.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	}
	r.mu.Unlock()
	if nsFD < 0 {
		return nil, errors.New("the sandbox's network is gone")
	}
	defer unix.Close(nsFD)
	var c net.Conn
	err := netns.Do(nsFD, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return err
	})
	return c, err
}
