package vmagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/ttrpc"

	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// acceptRetryDelay paces Accept after an error that is not the listener
// closing (out of file descriptors, say).
const acceptRetryDelay = 100 * time.Millisecond

// agent serves the host's connections: ttrpc ones to the service, stdio
// ones to the processes they name.
type agent struct {
	logf    func(string, ...any)
	svc     *service
	server  *ttrpc.Server
	rpcConn *connQueue
}

func newAgent(svc *service) (*agent, error) {
	server, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(errorsToStatus))
	if err != nil {
		return nil, fmt.Errorf("ttrpc server: %w", err)
	}
	vmagentv1.RegisterVMAgentService(server, svc)
	return &agent{logf: svc.logf, svc: svc, server: server, rpcConn: newConnQueue()}, nil
}

// serve dispatches the connections of ln until ctx ends.
func (a *agent) serve(ctx context.Context, ln net.Listener) error {
	go a.server.Serve(ctx, a.rpcConn)
	defer a.server.Close()
	defer a.rpcConn.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			a.logf("accept: %v", err)
			time.Sleep(acceptRetryDelay)
			continue
		}
		go a.dispatch(conn)
	}
}

// dispatch reads conn's preface and hands it on.
func (a *agent) dispatch(conn net.Conn) {
	streams := a.svc.streams
	streams.startReading()
	kind, id, err := vmtransport.ReadPreface(conn)
	if err != nil {
		streams.doneReading()
		a.logf("connection refused: %v", err)
		conn.Close()
		return
	}
	if kind == vmtransport.KindTTRPC {
		streams.doneReading()
		a.rpcConn.push(conn)
		return
	}
	if a.svc.procs.started(id) {
		streams.doneReading()
		a.logf("%s stream of process %s refused: the process was started already", kind, id)
		conn.Close()
		return
	}
	if err := streams.add(id, kind, conn); err != nil {
		a.logf("%v", err)
		conn.Close()
	}
}

// connQueue is a net.Listener of the connections dispatch found to be ttrpc.
type connQueue struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) push(c net.Conn) {
	select {
	case q.conns <- c:
	case <-q.done:
		c.Close()
	}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.closeOnce.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return queueAddr{} }

type queueAddr struct{}

func (queueAddr) Network() string { return "vmagent" }
func (queueAddr) String() string  { return "ttrpc" }
