package ttrpclite

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

// pair serves methods on a unix socket and returns a client of it.
func pair(t *testing.T, sameUser bool, methods map[string]Method) (*Server, *Client, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(sameUser)
	srv.Register("test.Svc", methods)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return srv, dial(t, sock), sock
}

func dial(t *testing.T, sock string) *Client {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(conn)
	t.Cleanup(func() { c.Close() })
	return c
}

func echo(_ context.Context, req []byte) ([]byte, error) { return req, nil }

func TestCallsAndErrors(t *testing.T) {
	_, c, _ := pair(t, true, map[string]Method{
		"Echo": echo,
		"Fail": func(context.Context, []byte) ([]byte, error) {
			return nil, errdefs.FailedPrecondition("session x is not running")
		},
		"Plain": func(context.Context, []byte) ([]byte, error) { return nil, errors.New("plain trouble") },
	})
	ctx := context.Background()
	for _, in := range [][]byte{nil, []byte("hello"), bytes.Repeat([]byte{0xff}, 1<<20)} {
		out, err := c.Call(ctx, "test.Svc", "Echo", in)
		if err != nil || !bytes.Equal(out, in) {
			t.Errorf("Echo of %d bytes: %d bytes back, %v", len(in), len(out), err)
		}
	}
	_, err := c.Call(ctx, "test.Svc", "Fail", nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || err.Error() != "session x is not running" {
		t.Errorf("Fail: %v, want FailedPrecondition with the server's text", err)
	}
	if _, err := c.Call(ctx, "test.Svc", "Plain", nil); err == nil || err.Error() != "plain trouble" || errdefs.CodeOf(err) != errdefs.CodeUnknown {
		t.Errorf("Plain: %v, want an error of no kind with the server's text", err)
	}
	if _, err := c.Call(ctx, "test.Svc", "Nope", nil); err == nil || err.Error() != "method Nope" {
		t.Errorf("an unknown method: %v", err)
	}
	if _, err := c.Call(ctx, "test.Other", "Echo", nil); err == nil || err.Error() != "service test.Other" {
		t.Errorf("an unknown service: %v", err)
	}
	if _, err := c.Call(ctx, "test.Svc", "Echo", make([]byte, MaxMessage+1)); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("an oversized request: %v, want ResourceExhausted before it is sent", err)
	}
	if out, err := c.Call(ctx, "test.Svc", "Echo", []byte("still")); err != nil || string(out) != "still" {
		t.Errorf("the connection after the errors: %q, %v", out, err)
	}
}

// TestConcurrentCalls: a call that blocks (Wait) holds up no other, and a
// caller that gives up leaves the connection usable.
func TestConcurrentCalls(t *testing.T) {
	release := make(chan struct{})
	_, c, _ := pair(t, true, map[string]Method{
		"Echo": echo,
		"Block": func(ctx context.Context, _ []byte) ([]byte, error) {
			select {
			case <-release:
				return []byte("released"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		},
	})
	blocked := make(chan error, 1)
	go func() {
		out, err := c.Call(context.Background(), "test.Svc", "Block", nil)
		if err == nil && string(out) != "released" {
			err = errors.New("wrong answer " + string(out))
		}
		blocked <- err
	}()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			in := []byte(strings.Repeat("x", i))
			if out, err := c.Call(context.Background(), "test.Svc", "Echo", in); err != nil || !bytes.Equal(out, in) {
				t.Errorf("call %d beside a blocked one: %q, %v", i, out, err)
			}
		})
	}
	wg.Wait()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Call(ctx, "test.Svc", "Block", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call past its deadline: %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := <-blocked; err != nil {
		t.Errorf("the blocked call: %v", err)
	}
	if out, err := c.Call(context.Background(), "test.Svc", "Echo", []byte("after")); err != nil || string(out) != "after" {
		t.Errorf("after a call gave up: %q, %v", out, err)
	}
}

// TestDeadlineAndHangUp: the server's call ends at the deadline the client
// sent, and when its client hangs up.
func TestDeadlineAndHangUp(t *testing.T) {
	ended := make(chan error, 2)
	_, c, sock := pair(t, true, map[string]Method{
		"Block": func(ctx context.Context, _ []byte) ([]byte, error) {
			<-ctx.Done()
			ended <- ctx.Err()
			return nil, ctx.Err()
		},
	})
	// The server's deadline: a client whose own wait is longer sees the
	// server end the call.
	go c.Call(context.Background(), "test.Svc", "Block", nil)
	select {
	case err := <-ended:
		t.Errorf("the call ended (%v) with no deadline sent", err)
	case <-time.After(300 * time.Millisecond):
	}
	c2 := dial(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c2.Call(ctx, "test.Svc", "Block", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call with a deadline: %v", err)
	}
	if err := <-ended; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the server's call ended with %v, want DeadlineExceeded", err)
	}
	c.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the hung-up call ended with %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a call whose client hung up still runs")
	}
	if _, err := c.Call(context.Background(), "test.Svc", "Block", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("a call on a closed client: %v, want ErrClosed", err)
	}
	if _, err := c2.Call(ctx, "test.Svc", "Block", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call whose deadline has passed: %v", err)
	}
	if _, err := c2.Call(context.Background(), "test.Svc", "Nope", nil); err == nil || errors.Is(err, ErrClosed) {
		t.Errorf("the connection after a call that was never sent: %v, want the server's answer", err)
	}
}

// passedDeadline is a context whose deadline has passed while its timer has
// not run yet, which a loaded machine produces.
type passedDeadline struct{ context.Context }

func (passedDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestPassedDeadlineKeepsTheConnection: a call that cannot be sent in time
// fails alone; the connection stays usable.
func TestPassedDeadlineKeepsTheConnection(t *testing.T) {
	_, c, _ := pair(t, true, map[string]Method{
		"Echo": func(_ context.Context, b []byte) ([]byte, error) { return b, nil },
	})
	if _, err := c.Call(passedDeadline{context.Background()}, "test.Svc", "Echo", []byte("x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call whose deadline has passed: %v, want DeadlineExceeded", err)
	}
	if got, err := c.Call(context.Background(), "test.Svc", "Echo", []byte("y")); err != nil || string(got) != "y" {
		t.Errorf("the next call: %q, %v; want \"y\"", got, err)
	}
}

// TestShutdownAnswersCallsInFlight: Shutdown lets a call in flight write
// its answer (the shim's own Shutdown call among them), then closes.
func TestShutdownAnswersCallsInFlight(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	srv, c, sock := pair(t, true, map[string]Method{
		"Slow": func(context.Context, []byte) ([]byte, error) {
			close(started)
			<-release
			return []byte("answered"), nil
		},
	})
	answer := make(chan error, 1)
	go func() {
		out, err := c.Call(context.Background(), "test.Svc", "Slow", nil)
		if err == nil && string(out) != "answered" {
			err = errors.New("wrong answer " + string(out))
		}
		answer <- err
	}()
	<-started
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a call in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Error("a server shutting down still accepts")
	}
	close(release)
	if err := <-answer; err != nil {
		t.Errorf("the call in flight: %v, want its answer", err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if _, err := c.Call(context.Background(), "test.Svc", "Slow", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("a call after Shutdown: %v, want ErrClosed", err)
	}

	// Bounded by its context.
	srv2, c2, _ := pair(t, true, map[string]Method{"Hang": func(ctx context.Context, _ []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}})
	go c2.Call(context.Background(), "test.Svc", "Hang", nil)
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := srv2.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown with a call that never ends: %v, want DeadlineExceeded", err)
	}
}

// TestBadFrames: what a confused or hostile peer sends is answered with an
// error or ends its connection, never the server.
func TestBadFrames(t *testing.T) {
	_, good, sock := pair(t, true, map[string]Method{"Echo": echo})
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string // in the response's message; "" when the server hangs up
	}{
		{"even stream id", appendFrame(nil, 2, typeRequest, (&request{service: "test.Svc", method: "Echo"}).marshal()), "must be odd"},
		{"data frame", appendFrame(nil, 1, typeData, []byte("x")), "unary calls only"},
		{"garbage request", appendFrame(nil, 1, typeRequest, []byte{0xff, 0xff, 0xff}), "unmarshal request"},
		{"oversized", []byte{0, 0x40, 0, 1, 0, 0, 0, 1, typeRequest, 0}, ""},
	} {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write(tc.frame); err != nil {
			t.Fatal(err)
		}
		if tc.want == "" {
			conn.(*net.UnixConn).CloseWrite() // the 4 MiB it announced never come
		}
		var hbuf [headerLength]byte
		h, err := readHeader(conn, &hbuf)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%s: answered (%+v), want the connection ended", tc.name, h)
			}
			conn.Close()
			continue
		}
		if err != nil {
			t.Errorf("%s: no answer: %v", tc.name, err)
			conn.Close()
			continue
		}
		data := make([]byte, h.length)
		if _, err := conn.Read(data); err != nil && h.length > 0 {
			t.Fatal(err)
		}
		var resp response
		if err := resp.unmarshal(data); err != nil || resp.code != errdefs.CodeInvalidArgument || !strings.Contains(resp.message, tc.want) {
			t.Errorf("%s: answered %+v (%v), want InvalidArgument saying %q", tc.name, resp, err, tc.want)
		}
		conn.Close()
	}
	if out, err := good.Call(context.Background(), "test.Svc", "Echo", []byte("ok")); err != nil || string(out) != "ok" {
		t.Errorf("another connection after the bad frames: %q, %v", out, err)
	}
}

// TestRefusesOtherUsers: with sameUser, a peer of another effective uid is
// hung up on before any call. Needs root to connect as nobody.
func TestRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("connecting as another user needs root")
	}
	_, _, sock := pair(t, true, map[string]Method{"Echo": echo})
	os.Chmod(filepath.Dir(filepath.Dir(sock)), 0o755)
	os.Chmod(filepath.Dir(sock), 0o755)
	os.Chmod(sock, 0o777)
	conn := dialAs(t, sock, 65534)
	c := NewClient(conn)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, "test.Svc", "Echo", []byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("a call as uid 65534 to a same-user server: %v, want the connection closed", err)
	}
}

// dialAs connects to sock from a thread whose effective uid is uid: peer
// credentials are the connecting thread's. The thread is never handed back
// to the runtime (its goroutine ends locked), so no other code runs as uid.
func dialAs(t *testing.T, sock string, uid int) net.Conn {
	t.Helper()
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			done <- result{-1, e}
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			if err = unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
				unix.Close(fd)
			}
		}
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("connect as uid %d: %v", uid, r.err)
	}
	f := os.NewFile(uintptr(r.fd), "conn")
	defer f.Close()
	conn, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestConnDone: a call's ConnDone outlives the call and ends with its
// connection, not with the call's own deadline.
func TestConnDone(t *testing.T) {
	got := make(chan (<-chan struct{}), 1)
	_, c, _ := pair(t, true, map[string]Method{
		"Keep": func(ctx context.Context, req []byte) ([]byte, error) {
			got <- ConnDone(ctx)
			return nil, nil
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Call(ctx, "test.Svc", "Keep", nil); err != nil {
		t.Fatal(err)
	}
	done := <-got
	if done == nil {
		t.Fatal("no ConnDone in a served call")
	}
	select {
	case <-done:
		t.Fatal("ConnDone ended with the call")
	case <-time.After(50 * time.Millisecond):
	}
	c.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ConnDone did not end with the connection")
	}
	if ConnDone(context.Background()) != nil {
		t.Error("ConnDone outside a call is not nil")
	}
}
