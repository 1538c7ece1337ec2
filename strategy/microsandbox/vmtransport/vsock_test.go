package vmtransport

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// The real vsock path (a guest listening, the host dialling its CID) is not
// exercised on this machine: it has no /dev/kvm and no /dev/vhost-vsock, so
// no guest can have a vsock device. Only the host's error path is tested.

func TestDialVsockWithoutVhostVsock(t *testing.T) {
	if _, err := os.Stat(vhostVsockDevice); err == nil {
		t.Skipf("%s exists here; this test covers hosts without it", vhostVsockDevice)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := DialVsock(ctx, 3, DefaultPort)
	if !errors.Is(err, ErrNoVsock) {
		t.Fatalf("DialVsock = %v, want ErrNoVsock", err)
	}
	for _, want := range []string{"cid 3", "port 1024", vhostVsockDevice, "serial transport"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("DialVsock error %q does not mention %q", err, want)
		}
	}
	start := time.Now()
	_, err = DialWithRetry(ctx, VsockDialer{CID: 3, Port: DefaultPort}, 10*time.Millisecond)
	if !errors.Is(err, ErrNoVsock) || time.Since(start) > time.Second {
		t.Errorf("DialWithRetry(vsock) = %v after %v, want ErrNoVsock at once", err, time.Since(start))
	}
}
