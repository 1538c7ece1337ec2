package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"time"
)

const (
	// maxResponseHeaderBytes bounds an origin's status line plus headers.
	maxResponseHeaderBytes = 1 << 20
	// maxInformational bounds the 1xx responses passed on before the final one.
	maxInformational = 16
	// lingerTimeout and lingerBytes bound how long and how much of a refused
	// request's body is read and dropped after the error reply, so the client
	// sees the reply instead of a reset.
	lingerTimeout = 500 * time.Millisecond
	lingerBytes   = 256 << 10
)

// aLongTimeAgo is a deadline in the past: it makes blocked reads return.
var aLongTimeAgo = time.Unix(1, 0)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), plus the non-standard Proxy-Connection.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func (s *Server) serveHTTP(ctx context.Context, set *connSet, cc *clientConn) {
	for {
		cc.SetDeadline(time.Now().Add(s.handshakeTimeout()))
		cc.lr.N = maxHeaderBytes + int64(cc.br.Size()) // the reader may run one buffer ahead
		req, err := http.ReadRequest(cc.br)
		if err != nil {
			switch {
			case cc.lr.N <= 0:
				reject(cc, http.StatusRequestHeaderFieldsTooLarge, "request headers are larger than 64 KiB", "")
			case errors.Is(err, io.EOF), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
				// closed between requests, or stalled: nothing to answer
			default:
				reject(cc, http.StatusBadRequest, "malformed request: "+err.Error(), "")
			}
			return
		}
		cc.lr.N = 1<<63 - 1
		cc.SetDeadline(time.Time{})
		var keepAlive bool
		if req.Method == http.MethodConnect {
			s.handleConnect(ctx, set, cc, req)
		} else {
			keepAlive = s.handleForward(ctx, set, cc, req)
		}
		if !keepAlive {
			return
		}
	}
}

// handleConnect answers CONNECT host:port with 200 and a tunnel.
func (s *Server) handleConnect(ctx context.Context, set *connSet, cc *clientConn, req *http.Request) {
	host, portStr, err := net.SplitHostPort(req.URL.Host)
	if err != nil || host == "" {
		reject(cc, http.StatusBadRequest, fmt.Sprintf("CONNECT needs host:port, got %q", req.RequestURI), "")
		return
	}
	port, err := parsePort(portStr)
	if err != nil {
		reject(cc, http.StatusBadRequest, err.Error(), "")
		return
	}
	up, err := s.connect(ctx, "connect", host, port)
	if err != nil {
		rejectFailure(cc, err)
		return
	}
	if !set.add(up) {
		up.Close()
		return
	}
	defer set.remove(up)
	defer up.Close()
	cc.SetWriteDeadline(time.Now().Add(replyTimeout))
	if _, err := io.WriteString(cc, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	tunnel(cc, up)
}

// handleForward sends an absolute-URI request to its origin and streams the
// response back. It reports whether the client connection may carry another
// request.
func (s *Server) handleForward(ctx context.Context, set *connSet, cc *clientConn, req *http.Request) (keepAlive bool) {
	if !req.URL.IsAbs() || req.URL.Host == "" {
		reject(cc, http.StatusBadRequest, fmt.Sprintf("not a proxy request: %q (send an absolute http:// URL, or CONNECT host:port)", req.RequestURI), "")
		return false
	}
	if req.URL.Scheme != "http" {
		reject(cc, http.StatusBadRequest, fmt.Sprintf("unsupported scheme %q: send http:// URLs, or CONNECT host:port for https", req.URL.Scheme), "")
		return false
	}
	port := 80
	if p := req.URL.Port(); p != "" {
		var err error
		if port, err = parsePort(p); err != nil {
			reject(cc, http.StatusBadRequest, err.Error(), "")
			return false
		}
	}
	up, err := s.connect(ctx, "http", req.URL.Hostname(), port)
	if err != nil {
		rejectFailure(cc, err)
		return false
	}
	if !set.add(up) {
		up.Close()
		return false
	}
	defer set.remove(up)
	defer up.Close()
	return forward(cc, req, up)
}

// forward writes req to up (concurrently: an origin may answer before it has
// read the whole body), then passes the origin's response on.
func forward(cc *clientConn, req *http.Request, up net.Conn) (keepAlive bool) {
	out := outgoingRequest(req)
	written := make(chan error, 1)
	go func() { written <- out.Write(up) }()
	// finish ends the exchange and stops the writer if it is still busy:
	// blocked on the origin (closing up ends that) or reading a body the
	// origin did not wait for (an expired read deadline ends that). The client
	// connection can be kept only when the request was written completely.
	finish := func(keep bool) bool {
		up.Close()
		cc.SetReadDeadline(aLongTimeAgo)
		err := <-written
		cc.SetReadDeadline(time.Time{})
		return keep && err == nil
	}

	ulr := &io.LimitedReader{R: up}
	ubr := bufio.NewReader(ulr)
	var resp *http.Response
	for i := 0; ; i++ {
		ulr.N = maxResponseHeaderBytes
		r, err := http.ReadResponse(ubr, out)
		if err != nil {
			writeError(cc, http.StatusBadGateway, fmt.Sprintf("read response from %s: %v", req.URL.Host, err), "")
			return finish(false)
		}
		ulr.N = 1<<63 - 1
		if r.StatusCode == http.StatusSwitchingProtocols || r.StatusCode >= 200 {
			resp = r
			break
		}
		if i == maxInformational {
			writeError(cc, http.StatusBadGateway, fmt.Sprintf("%s sent more than %d informational responses", req.URL.Host, maxInformational), "")
			return finish(false)
		}
		removeHopByHop(r.Header)
		if err := writeInformational(cc, r); err != nil {
			return finish(false)
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		writeError(cc, http.StatusBadGateway, fmt.Sprintf("%s switched protocols, which a forwarded request cannot do (use CONNECT)", req.URL.Host), "")
		return finish(false)
	}

	// http.ReadResponse already dropped a Connection header that says
	// "close", and with it the names it listed (net/http's own reverse proxy
	// has the same limit); every other hop-by-hop header goes here.
	removeHopByHop(resp.Header)
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	http11 := req.ProtoAtLeast(1, 1)
	if !http11 && isChunked(resp.TransferEncoding) {
		// An HTTP/1.0 client cannot read chunks: send the body until close.
		resp.TransferEncoding, resp.Trailer = nil, nil
	}
	delimited := resp.ContentLength >= 0 || isChunked(resp.TransferEncoding) || req.Method == http.MethodHead
	keep := http11 && !req.Close && delimited
	resp.Close = !keep
	if err := resp.Write(cc); err != nil {
		keep = false
	}
	return finish(keep)
}

// outgoingRequest is req as the origin should see it: origin-form target,
// Host from the URL, no hop-by-hop headers, one request per connection.
func outgoingRequest(req *http.Request) *http.Request {
	out := req.Clone(req.Context())
	out.Trailer = req.Trailer // filled in as the body is read to its end
	removeHopByHop(out.Header)
	out.RequestURI = ""
	out.Host = req.URL.Host
	out.Close = true
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = []string{""} // Write would add Go's own
	}
	return out
}

func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

func isChunked(te []string) bool { return len(te) > 0 && te[0] == "chunked" }

func writeInformational(c net.Conn, r *http.Response) error {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %03d %s\r\n", r.StatusCode, strings.TrimPrefix(r.Status, fmt.Sprintf("%03d ", r.StatusCode)))
	r.Header.Write(&b)
	b.WriteString("\r\n")
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	defer c.SetWriteDeadline(time.Time{})
	_, err := io.WriteString(c, b.String())
	return err
}

// rejectFailure answers a failed connect: 403 for a refusal, 502 otherwise.
func rejectFailure(cc *clientConn, err error) {
	var re *refusedError
	if errors.As(err, &re) {
		reject(cc, http.StatusForbidden, re.v.Reason, re.v.Reason)
		return
	}
	reject(cc, http.StatusBadGateway, err.Error(), "")
}

// reject writes an error reply and then drops what the client still sends
// for a moment, so it reads the reply rather than a connection reset. The
// caller closes the connection.
func reject(cc *clientConn, code int, msg, policy string) {
	if writeError(cc, code, msg, policy) != nil {
		return
	}
	if cw, ok := cc.Conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	cc.SetReadDeadline(time.Now().Add(lingerTimeout))
	cc.lr.N = lingerBytes
	io.Copy(io.Discard, cc.br)
}

// writeError writes a plain-text error reply that closes the connection.
// policy, when set, goes into X-Agentconnect-Policy.
func writeError(c net.Conn, code int, msg, policy string) error {
	body := msg + "\n"
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, http.StatusText(code))
	if policy != "" {
		fmt.Fprintf(&b, "X-Agentconnect-Policy: %s\r\n", headerValue(policy))
	}
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	_, err := io.WriteString(c, b.String())
	return err
}

// headerValue replaces control characters, which may not appear in a header
// value.
func headerValue(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
