// Package inject puts a session's secrets on the wire: a connection to a
// host a secret is bound to is intercepted with a certificate of the
// session's own CA, each request's placeholders are swapped for the values
// in the secret's headers (inside Basic credentials too), the request goes
// on over TLS verified against the host's trust store, and the value is
// swapped back for the placeholder in what comes back, so that no echo of
// it reaches the session.
//
// The proxy in front of it (srt's, or the VM's network stack) decides the
// policy and dials: Intercept gets the client's connection and the
// upstream one, already connected to the address the policy allowed.
package inject

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
)

// Secret is one binding of a session: what stands for the value inside,
// the value, and where it may go.
type Secret struct {
	Placeholder string
	Value       string
	// Hosts are network policy entries: a name, *.name or an IP, each with
	// an optional :port.
	Hosts []string
	// Headers are the request headers (lower case) the value may be put
	// in; none means any.
	Headers []string
	// TokenHosts are where the value is renewed: an OAuth token endpoint.
	// In requests to them the placeholder is swapped in the body too (a
	// refresh token travels there), and the string field TokenField
	// ("access_token", "refresh_token", "id_token") of their JSON answers
	// is the value's next version: it replaces the value, goes to
	// Config.OnUpdate, and reaches the session as the placeholder.
	TokenHosts []string
	TokenField string
}

// Config is an injector's secrets and trust.
type Config struct {
	Secrets []Secret
	// RootCAs verify the hosts' certificates; nil means the system's.
	RootCAs *x509.CertPool
	// Logf reports what was refused, naming hosts and secrets by their
	// placeholders' hosts, never values.
	Logf func(format string, args ...any)
	// OnUpdate, if set, is given each renewed value, by its placeholder.
	OnUpdate func(placeholder, value string)
}

// Injector intercepts one session's connections to bound hosts.
type Injector struct {
	cfg     Config
	ca      *ca
	secrets []*boundSecret

	mu sync.Mutex // guards the values of secrets (renewed) and their past values
}

type boundSecret struct {
	Secret
	hosts, tokenHosts *netpolicy.Binding
	// past are the values the secret had before: their echoes are
	// redacted too.
	past []string
}

// New makes the session's CA and checks the secrets.
func New(cfg Config) (*Injector, error) {
	in := &Injector{cfg: cfg}
	var hosts []string
	for _, s := range cfg.Secrets {
		if s.Placeholder == "" || s.Value == "" || len(s.Hosts)+len(s.TokenHosts) == 0 {
			return nil, errors.New("inject: a secret needs a placeholder, a value and a host")
		}
		if (s.TokenField == "") != (len(s.TokenHosts) == 0) || s.TokenField != "" && !slices.Contains(tokenFields, s.TokenField) {
			return nil, fmt.Errorf("inject: a renewed secret needs token hosts and one of the token fields %s", strings.Join(tokenFields, ", "))
		}
		p, err := netpolicy.NewBinding(s.Hosts)
		if err != nil {
			return nil, fmt.Errorf("inject: %w", err)
		}
		tp, err := netpolicy.NewBinding(s.TokenHosts)
		if err != nil {
			return nil, fmt.Errorf("inject: %w", err)
		}
		in.secrets = append(in.secrets, &boundSecret{Secret: s, hosts: p, tokenHosts: tp})
		for _, h := range append(slices.Clone(s.Hosts), s.TokenHosts...) {
			host := h
			if hh, _, err := net.SplitHostPort(h); err == nil {
				host = hh
			}
			hosts = append(hosts, strings.Trim(host, "[]"))
		}
	}
	if in.cfg.Logf == nil {
		in.cfg.Logf = func(string, ...any) {}
	}
	if in.cfg.OnUpdate == nil {
		in.cfg.OnUpdate = func(string, string) {}
	}
	ca, err := newCA(hosts)
	if err != nil {
		return nil, err
	}
	in.ca = ca
	return in, nil
}

// CACertPEM is the session CA's certificate, for the boundary's trust
// store. Its key stays in this process.
func (in *Injector) CACertPEM() []byte { return in.ca.pem }

// Binds reports whether a secret is bound to host:port (netpolicy.Binding:
// 443 for a host named without a port): the proxy hands such connections to
// Intercept and tunnels every other one untouched.
func (in *Injector) Binds(host string, port int) bool { return in.bound(host, port, false) }

// bound reports whether host:port is bound, over plain HTTP or HTTPS, for
// the swap or the renewal of a secret.
func (in *Injector) bound(host string, port int, plain bool) bool {
	for _, s := range in.secrets {
		if s.hosts.Binds(host, port, plain) || s.tokenHosts.Binds(host, port, plain) {
			return true
		}
	}
	return false
}

// renewedAt are the secrets whose token hosts include host:port.
func (in *Injector) renewedAt(host string, port int, plain bool) []*boundSecret {
	var at []*boundSecret
	for _, s := range in.secrets {
		if s.tokenHosts.Binds(host, port, plain) {
			at = append(at, s)
		}
	}
	return at
}

// value is s's value now.
func (in *Injector) value(s *boundSecret) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return s.Value
}

// swapRequest puts the values of the secrets bound to host:port in h, in
// place of their placeholders: in the headers each secret allows, and in
// Basic credentials, decoded and encoded again. Placeholders of secrets not
// bound here are left as they are: they are worthless outside. It returns
// the encoded credentials it made, each with what it stood for inside, so
// that an echo of them is redacted too. plain: the request is plain HTTP.
func (in *Injector) swapRequest(h http.Header, host string, port int, plain bool) [][2][]byte {
	var made [][2][]byte
	for _, s := range in.secrets {
		if !s.hosts.Binds(host, port, plain) {
			continue
		}
		value := in.value(s)
		for name, values := range h {
			if len(s.Headers) > 0 && !containsFold(s.Headers, name) {
				continue
			}
			for i, v := range values {
				swapped := swapValue(v, s.Placeholder, value)
				if _, cred, ok := strings.Cut(swapped, " "); ok && swapped != strings.ReplaceAll(v, s.Placeholder, value) {
					_, inside, _ := strings.Cut(v, " ")
					made = append(made, [2][]byte{[]byte(cred), []byte(strings.TrimSpace(inside))})
				}
				values[i] = swapped
			}
		}
	}
	return made
}

// swapValue replaces old by new in a header value, and inside a Basic
// credential (base64 of user:password) too.
func swapValue(v, old, new string) string {
	v = strings.ReplaceAll(v, old, new)
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return v
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil || !bytes.Contains(raw, []byte(old)) {
		return v
	}
	return scheme + " " + base64.StdEncoding.EncodeToString(bytes.ReplaceAll(raw, []byte(old), []byte(new)))
}

// pairs are the byte strings to swap back in what a host sends: each
// value for its placeholder, and the encoded credentials made from them.
func (in *Injector) pairs(made [][2][]byte) [][2][]byte {
	var p [][2][]byte
	in.mu.Lock()
	for _, s := range in.secrets {
		for _, v := range append([]string{s.Value}, s.past...) {
			p = append(p, [2][]byte{[]byte(v), []byte(s.Placeholder)})
		}
	}
	in.mu.Unlock()
	return append(p, made...)
}

// redactHeader swaps every pair back in every header of a response.
func redactHeader(h http.Header, pairs [][2][]byte) {
	for _, values := range h {
		for i, v := range values {
			for _, p := range pairs {
				v = strings.ReplaceAll(v, string(p[0]), string(p[1]))
			}
			values[i] = v
		}
	}
}

func containsFold(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

// Intercept is Serve for a proxy (srt's proxy.Interceptor, vmnet's): what
// goes wrong is logged.
func (in *Injector) Intercept(ctx context.Context, client net.Conn, buffered []byte, upstream net.Conn, hosts []string, port int) {
	if err := in.Serve(ctx, client, buffered, upstream, hosts, port); err != nil {
		in.cfg.Logf("secret injection for %s: %v", hostPort(hosts, port), err)
	}
}

// tlsHandshake is the first byte a TLS client sends (a handshake record).
const tlsHandshake = 0x16

// Serve serves one connection of the session to port on the address that
// hosts (the names the session may have meant, each one Binds said is
// bound) lead to: client is the session's side (buffered what its proxy
// read of it already), upstream a connection to the address the proxy
// allowed. A connection that starts a TLS handshake is served as HTTPS to
// the host its server name picks (the first host when it names none); any
// other as plain HTTP, which only a host:port bound explicitly gets. It
// returns when either side is done; both connections are closed then.
func (in *Injector) Serve(ctx context.Context, client net.Conn, buffered []byte, upstream net.Conn, hosts []string, port int) error {
	defer client.Close()
	defer upstream.Close()
	if len(hosts) == 0 {
		return errors.New("no host to serve")
	}
	br := bufio.NewReader(io.MultiReader(bytes.NewReader(buffered), client))
	client.SetReadDeadline(time.Now().Add(handshakeTimeout))
	first, err := br.Peek(1)
	client.SetReadDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("the session sent nothing: %w", err)
	}
	client = &prefixedConn{Conn: client, r: br}
	if first[0] != tlsHandshake {
		var plain []string
		for _, h := range hosts {
			if in.bound(h, port, true) {
				plain = append(plain, h)
			}
		}
		if len(plain) == 0 {
			refuse(client, fmt.Sprintf("agentconnect: %s is bound for HTTPS only: plain HTTP is injected only for a host:port a secret names; nothing was sent to it", hostPort(hosts, port)))
			return errors.New("refused plain HTTP to a host bound for HTTPS only")
		}
		return in.serve(ctx, client, upstream, plain, port, true)
	}
	var host string
	tc := tls.Server(client, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The name the client checks must be one the proxy let it
			// reach: a tunnel to one host may not ask for another's value.
			host = hosts[0]
			if sni := hello.ServerName; sni != "" {
				host = ""
				for _, h := range hosts {
					if strings.EqualFold(strings.TrimSuffix(sni, "."), h) {
						host = h
					}
				}
				if host == "" {
					return nil, fmt.Errorf("the TLS server name %q is not %s, which the connection was opened to", sni, strings.Join(hosts, " or "))
				}
			}
			return in.ca.leaf(host)
		},
	})
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		return fmt.Errorf("refused the session's TLS handshake: %w", err)
	}
	ucfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: host,
		RootCAs:    in.cfg.RootCAs,
		// Either side's protocol works with either of the other's: each
		// request is forwarded on its own.
		NextProtos: []string{"h2", "http/1.1"},
	}
	if netpolicy.IsHostName(host) {
		// The host's loopback: a service there has a certificate for its
		// own names, not for the name the boundary knows it by.
		ucfg.InsecureSkipVerify = true // verified below, against the same roots
		ucfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifyLoopback(cs, in.cfg.RootCAs) }
	}
	uc := tls.Client(upstream, ucfg)
	if err := uc.HandshakeContext(hctx); err != nil {
		// The session's client sees a reason instead of a reset.
		refuse(tc, fmt.Sprintf("agentconnect: %s:%d did not prove who it is (%v): no secret was sent to it", host, port, err))
		return fmt.Errorf("TLS upstream: %w", err)
	}
	return in.serve(ctx, tc, uc, []string{host}, port, false)
}

// hostPort names a connection's destination in messages.
func hostPort(hosts []string, port int) string {
	if len(hosts) == 0 {
		return fmt.Sprintf("port %d", port)
	}
	return net.JoinHostPort(strings.Join(hosts, " or "), strconv.Itoa(port))
}

// loopbackNames are the names a service on the host's loopback may have a
// certificate for.
var loopbackNames = []string{netpolicy.HostName, "localhost", "127.0.0.1", "::1"}

// verifyLoopback checks the host's loopback's certificate chain against
// roots (nil: the system's) for one of loopbackNames.
func verifyLoopback(cs tls.ConnectionState, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	var first error
	for _, name := range loopbackNames {
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name})
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return fmt.Errorf("not for any of %s: %w", strings.Join(loopbackNames, ", "), first)
}

// prefixedConn reads what the proxy had read first.
type prefixedConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// refuse answers the session's requests on c with a 502 that says why,
// over HTTP/1.1 or HTTP/2 (on a *tls.Conn that negotiated it), and closes c
// once one is answered.
func refuse(c net.Conn, msg string) {
	l := newOneConnListener(c)
	var answered atomic.Bool
	srv := &http.Server{
		ReadHeaderTimeout: handshakeTimeout,
		IdleTimeout:       handshakeTimeout,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Connection", "close")
			http.Error(w, msg, http.StatusBadGateway)
			answered.Store(true)
		}),
	}
	srv.ConnState = func(conn net.Conn, s http.ConnState) {
		// An HTTP/2 connection is idle before its first request too. Shutdown
		// lets the answer out (HTTP/2: a GOAWAY after it), then closes.
		if s == http.StateIdle && answered.Load() {
			go srv.Shutdown(context.Background())
		}
		l.connState(conn, s)
	}
	srv.Serve(l)
	l.wait()
}
