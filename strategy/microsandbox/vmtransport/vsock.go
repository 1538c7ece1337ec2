package vmtransport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"
)

// DefaultPort is the vsock port the guest agent listens on unless the kernel
// command line says otherwise (agentconnect.port=), as Kata's agent does.
const DefaultPort = 1024

// ErrNoVsock is the kind of error DialVsock returns when this host has no
// vsock transport to guests at all; DialWithRetry does not retry it.
var ErrNoVsock = errors.New("no vsock transport to guests on this host")

// vhostVsockDevice is what QEMU opens for a guest's vsock device; without it
// no guest on this host can have one.
const vhostVsockDevice = "/dev/vhost-vsock"

// ListenVsock listens on port for connections from the host (any CID): the
// guest side of the vsock transport.
func ListenVsock(port uint32) (net.Listener, error) {
	l, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, port, nil)
	if err != nil {
		return nil, fmt.Errorf("listen on vsock port %d: %w", port, err)
	}
	return l, nil
}

// DialVsock connects to port of the guest with context id cid: the host side
// of the vsock transport. The error wraps ErrNoVsock when the host has no
// vhost-vsock device, and names what to do about it.
func DialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	conn, err := vsock.DialContext(ctx, cid, port, nil)
	if err == nil {
		return conn, nil
	}
	if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EAFNOSUPPORT) {
		if _, serr := os.Stat(vhostVsockDevice); serr != nil {
			return nil, fmt.Errorf("dial vsock cid %d port %d: %w: %s is missing (load the vhost_vsock module, or use the serial transport): %v",
				cid, port, ErrNoVsock, vhostVsockDevice, err)
		}
	}
	return nil, fmt.Errorf("dial vsock cid %d port %d: %w", cid, port, err)
}

// VsockDialer dials the guest agent at vsock CID:Port.
type VsockDialer struct {
	CID  uint32
	Port uint32
}

// Dial connects once; see DialWithRetry.
func (d VsockDialer) Dial(ctx context.Context) (net.Conn, error) {
	return DialVsock(ctx, d.CID, d.Port)
}
