package handoff

import (
	"errors"
	"io"
	"net"
	"testing"
)

// tcpPair is two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestATunnelCrosses: both connections arrive, usable, with the header;
// the sender's copies can be closed at once; closing the sender ends the
// receiver's loop.
func TestATunnelCrosses(t *testing.T) {
	s, f, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	clientFar, client := tcpPair(t)
	upFar, up := tcpPair(t)
	if err := s.Send(Tunnel{Hosts: []string{"example.com"}, Port: 443, Buffered: []byte("hello")}, client, up); err != nil {
		t.Fatal(err)
	}
	client.Close()
	up.Close()
	tun, gotClient, gotUp, err := Receive(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if len(tun.Hosts) != 1 || tun.Hosts[0] != "example.com" || tun.Port != 443 || string(tun.Buffered) != "hello" {
		t.Errorf("tunnel %+v", tun)
	}
	go gotUp.Write([]byte("from up"))
	buf := make([]byte, 7)
	if _, err := io.ReadFull(upFar, buf); err != nil || string(buf) != "from up" {
		t.Errorf("the upstream connection: %q %v", buf, err)
	}
	go clientFar.Write([]byte("from client"))
	buf = make([]byte, 11)
	if _, err := io.ReadFull(gotClient, buf); err != nil || string(buf) != "from client" {
		t.Errorf("the client connection: %q %v", buf, err)
	}
	s.Close()
	if _, _, _, err := Receive(int(f.Fd())); !errors.Is(err, ErrClosed) {
		t.Errorf("after the sender closed: %v, want ErrClosed", err)
	}
	if err := s.Send(Tunnel{}, clientFar, upFar); err == nil {
		t.Error("Send after Close succeeded")
	}
}

// TestUpdatesCross: the inject process's updates reach ReadUpdates; Close
// ends a ReadUpdates blocked on the socket.
func TestUpdatesCross(t *testing.T) {
	s, f, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make(chan Update, 2)
	done := make(chan struct{})
	go func() { s.ReadUpdates(func(u Update) { got <- u }); close(done) }()
	if err := SendUpdate(int(f.Fd()), Update{Placeholder: "p", Value: "v2"}); err != nil {
		t.Fatal(err)
	}
	if u := <-got; u.Placeholder != "p" || u.Value != "v2" {
		t.Errorf("update %+v", u)
	}
	s.Close()
	<-done
	if _, _, _, err := Receive(int(f.Fd())); !errors.Is(err, ErrClosed) {
		t.Errorf("after the sender closed: %v, want ErrClosed", err)
	}
}
