package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/rpcstatus"
)

const (
	// refusedTimeout is how long a refused connection is kept, for its
	// first call to be answered with the reason.
	refusedTimeout = 5 * time.Second
	// maxRefused bounds the refused connections answered at once; more are
	// closed without an answer.
	maxRefused = 16
)

// peer is who is at the other end of an admin connection (SO_PEERCRED, and
// SO_PEERGROUPS for the supplementary groups), as it was at connect(2).
type peer struct {
	pid, uid, gid int
	groups        []int
}

// peerPolicy says who may use the admin socket: the daemon's own user,
// root, and with socketGroup the processes in that group (their primary or
// a supplementary group, the way the kernel checks the socket file's mode).
type peerPolicy struct {
	uid   int
	gid   int // -1: no socketGroup
	group string
}

func (s *Supervisor) peerPolicy() (peerPolicy, error) {
	p := peerPolicy{uid: os.Geteuid(), gid: -1}
	if g := s.cfg.SocketGroup; g != "" {
		grp, err := user.LookupGroup(g)
		if err != nil {
			return p, fmt.Errorf("socketGroup %q: %w", g, err)
		}
		if p.gid, err = strconv.Atoi(grp.Gid); err != nil {
			return p, fmt.Errorf("socketGroup %q: gid %q: %w", g, grp.Gid, err)
		}
		p.group = g
	}
	return p, nil
}

func (p peerPolicy) allows(c peer) bool {
	if c.uid == 0 || c.uid == p.uid {
		return true
	}
	if p.gid < 0 {
		return false
	}
	if c.gid == p.gid {
		return true
	}
	for _, g := range c.groups {
		if g == p.gid {
			return true
		}
	}
	return false
}

// refusal is what a refused client is told.
func (p peerPolicy) refusal() string {
	who := "root"
	if p.uid != 0 {
		who = fmt.Sprintf("uid %d (the daemon's user) and root", p.uid)
	}
	if p.gid < 0 {
		return fmt.Sprintf("permission denied: this daemon accepts admin connections from %s only: run the command as one of them "+
			"(socketGroup in the daemon's config.json opens the socket to a group)", who)
	}
	return fmt.Sprintf("permission denied: this daemon accepts admin connections from %s and members of group %s only: "+
		"run the command as one of them (a user just added to the group must log in again)", who, p.group)
}

// peerOf reads the credentials of the process at the other end of c.
func peerOf(c net.Conn, withGroups bool) (peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}, fmt.Errorf("not a unix socket connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{}, err
	}
	var p peer
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		if cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); credErr != nil {
			return
		}
		p = peer{pid: int(cred.Pid), uid: int(cred.Uid), gid: int(cred.Gid)}
		if withGroups {
			p.groups, credErr = peerGroups(int(fd))
		}
	}); err != nil {
		return peer{}, err
	}
	return p, credErr
}

// peerGroups reads SO_PEERGROUPS: an array of gid_t, which x/sys has no
// wrapper for.
func peerGroups(fd int) ([]int, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if errno == unix.ERANGE && int(n/4) > len(buf) {
			buf = make([]uint32, n/4)
			continue
		}
		if errno != 0 {
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		}
		groups := make([]int, n/4)
		for i := range groups {
			groups[i] = int(buf[i])
		}
		return groups, nil
	}
}

// guardedListener admits the admin connections whose peer the policy
// allows. The socket file's mode is the first check; this one holds when
// the mode or a directory's is loosened (by hand, by a umask, by a
// socketGroup that is changed later). A refused connection is logged with
// the peer's uid and pid and handed to the refusal server, which answers
// its calls with PermissionDenied and the reason: ttrpc's own handshakers
// can only close the connection, which a client reports as a daemon that
// hung up.
type guardedListener struct {
	net.Listener
	policy  peerPolicy
	log     *logrus.Logger
	refused chan net.Conn
}

func (l *guardedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p, err := peerOf(c, l.policy.gid >= 0)
		if err == nil && l.policy.allows(p) {
			return c, nil
		}
		fields := logrus.Fields{"uid": p.uid, "gid": p.gid, "pid": p.pid}
		if err != nil {
			fields = logrus.Fields{"error": err.Error()} // who it is is not known
		}
		l.log.WithFields(fields).Warn("admin connection refused: the peer is not the daemon's user, root or a member of socketGroup")
		c.SetDeadline(time.Now().Add(refusedTimeout))
		select {
		case l.refused <- c:
		default:
			c.Close()
		}
	}
}

// chanListener serves the connections sent on its channel.
type chanListener struct {
	conns  chan net.Conn
	addr   net.Addr
	closed chan struct{}
	once   sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// guard wraps the admin listener so that only allowed peers reach the admin
// API, and serves the refusals until ctx ends; stop ends the refusal server.
func (s *Supervisor) guard(ctx context.Context, l net.Listener) (net.Listener, func(), error) {
	policy, err := s.peerPolicy()
	if err != nil {
		return nil, nil, err
	}
	refuser, err := ttrpc.NewServer()
	if err != nil {
		return nil, nil, err
	}
	adminv1.RegisterAdminService(refuser, refusingAdmin{rpcstatus.ToStatus(errdefs.PermissionDenied("%s", policy.refusal()))})
	refused := &chanListener{conns: make(chan net.Conn, maxRefused), addr: l.Addr(), closed: make(chan struct{})}
	go refuser.Serve(ctx, refused)
	stop := func() {
		refuser.Close()
		refused.Close()
	}
	return &guardedListener{Listener: l, policy: policy, log: s.log, refused: refused.conns}, stop, nil
}

// refusingAdmin answers every admin call with err, and does nothing else.
// Each method is written out: a method added to the API does not compile
// until it refuses too.
type refusingAdmin struct{ err error }

var _ adminv1.AdminService = refusingAdmin{}

func (r refusingAdmin) Status(context.Context, *adminv1.StatusRequest) (*adminv1.StatusResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) CreateAgent(context.Context, *adminv1.CreateAgentRequest) (*adminv1.Agent, error) {
	return nil, r.err
}
func (r refusingAdmin) UpdateAgent(context.Context, *adminv1.UpdateAgentRequest) (*adminv1.Agent, error) {
	return nil, r.err
}
func (r refusingAdmin) GetAgent(context.Context, *adminv1.GetAgentRequest) (*adminv1.Agent, error) {
	return nil, r.err
}
func (r refusingAdmin) ListAgents(context.Context, *adminv1.ListAgentsRequest) (*adminv1.ListAgentsResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) DeleteAgent(context.Context, *adminv1.DeleteAgentRequest) (*adminv1.DeleteAgentResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) SetSecret(context.Context, *adminv1.SetSecretRequest) (*adminv1.Secret, error) {
	return nil, r.err
}
func (r refusingAdmin) ListSecrets(context.Context, *adminv1.ListSecretsRequest) (*adminv1.ListSecretsResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) RemoveSecret(context.Context, *adminv1.RemoveSecretRequest) (*adminv1.RemoveSecretResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) ListRuntimes(context.Context, *adminv1.ListRuntimesRequest) (*adminv1.ListRuntimesResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) InstallRuntime(context.Context, *adminv1.InstallRuntimeRequest) (*adminv1.Runtime, error) {
	return nil, r.err
}
func (r refusingAdmin) StartSession(context.Context, *adminv1.StartSessionRequest) (*adminv1.Session, error) {
	return nil, r.err
}
func (r refusingAdmin) ResumeSession(context.Context, *adminv1.ResumeSessionRequest) (*adminv1.Session, error) {
	return nil, r.err
}
func (r refusingAdmin) ListSessions(context.Context, *adminv1.ListSessionsRequest) (*adminv1.ListSessionsResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) GetSession(context.Context, *adminv1.GetSessionRequest) (*adminv1.Session, error) {
	return nil, r.err
}
func (r refusingAdmin) StopSession(context.Context, *adminv1.StopSessionRequest) (*adminv1.Session, error) {
	return nil, r.err
}
func (r refusingAdmin) KillSession(context.Context, *adminv1.KillSessionRequest) (*adminv1.KillSessionResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) WaitSession(context.Context, *adminv1.WaitSessionRequest) (*adminv1.Session, error) {
	return nil, r.err
}
func (r refusingAdmin) RemoveSession(context.Context, *adminv1.RemoveSessionRequest) (*adminv1.RemoveSessionResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) WriteStdin(context.Context, *adminv1.WriteStdinRequest) (*adminv1.WriteStdinResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) CloseStdin(context.Context, *adminv1.CloseStdinRequest) (*adminv1.CloseStdinResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) Forward(context.Context, *adminv1.ForwardRequest, adminv1.Admin_ForwardServer) error {
	return r.err
}
func (r refusingAdmin) Unforward(context.Context, *adminv1.UnforwardRequest) (*adminv1.UnforwardResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) ListForwards(context.Context, *adminv1.ListForwardsRequest) (*adminv1.ListForwardsResponse, error) {
	return nil, r.err
}
func (r refusingAdmin) Attach(context.Context, *adminv1.AttachRequest, adminv1.Admin_AttachServer) error {
	return r.err
}
func (r refusingAdmin) Events(context.Context, *adminv1.EventsRequest, adminv1.Admin_EventsServer) error {
	return r.err
}
