package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/idle"
)

// The HTTP side parses request and response heads itself (net/http, and the
// crypto/tls it pulls in, would cost every shim about 1 MiB of memory). Each
// client connection carries one request; a forwarded request goes to its
// origin with "Connection: close", and the origin's response comes back with
// its own framing and "Connection: close".

const (
	// maxResponseHeaderBytes bounds an origin's status line plus headers.
	maxResponseHeaderBytes = 1 << 20
	// maxInformational bounds the 1xx responses passed on before the final one.
	maxInformational = 16
	// lingerTimeout and lingerBytes bound how long and how much of what a
	// client still sends is read and dropped before its connection is closed,
	// so it sees the reply instead of a reset.
	lingerTimeout = 500 * time.Millisecond
	lingerBytes   = 256 << 10
)

// aLongTimeAgo is a deadline in the past: it makes blocked reads return.
var aLongTimeAgo = time.Unix(1, 0)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), plus the non-standard Proxy-Connection. They are
// dropped from forwarded requests and responses. Transfer-Encoding stays (the
// body is relayed with its framing), and so does Trailer: it is end-to-end
// (RFC 9110 section 6.6.2) and announces the trailers relayed with a chunked
// body.
var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Upgrade",
}

// framingHeaders may not be dropped by being named in Connection: the proxy
// and the origin must agree on where a message ends.
var framingHeaders = []string{"Content-Length", "Transfer-Encoding", "Host"}

var (
	errHeadTooLarge = errors.New("header section too large")
	errBadChunked   = errors.New("malformed chunked encoding")
)

// field is one header field, its name as sent.
type field struct{ name, value string }

// header is a message's header fields in the order they came.
type header []field

// values returns the values of the fields called name.
func (h header) values(name string) []string {
	var vs []string
	for _, f := range h {
		if strings.EqualFold(f.name, name) {
			vs = append(vs, f.value)
		}
	}
	return vs
}

func (h header) has(name string) bool {
	for _, f := range h {
		if strings.EqualFold(f.name, name) {
			return true
		}
	}
	return false
}

// withoutHopByHop returns h without the hop-by-hop fields, the ones its
// Connection fields name included.
func (h header) withoutHopByHop() header {
	drop := hopByHop
	for _, v := range h.values("Connection") {
		for _, name := range splitList(v) {
			if !containsFold(framingHeaders, name) {
				drop = append(drop[:len(drop):len(drop)], name)
			}
		}
	}
	var out header
	for _, f := range h {
		if !containsFold(drop, f.name) {
			out = append(out, f)
		}
	}
	return out
}

// without returns h without the fields called name.
func (h header) without(name string) header {
	var out header
	for _, f := range h {
		if !strings.EqualFold(f.name, name) {
			out = append(out, f)
		}
	}
	return out
}

func (h header) appendTo(b []byte) []byte {
	for _, f := range h {
		b = append(b, f.name...)
		b = append(b, ": "...)
		b = append(b, f.value...)
		b = append(b, "\r\n"...)
	}
	return b
}

// splitList splits a comma-separated header value into its non-empty,
// trimmed elements.
func splitList(v string) []string {
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		if e = strings.Trim(e, " \t"); e != "" {
			out = append(out, e)
		}
	}
	return out
}

func containsFold(list []string, s string) bool {
	for _, e := range list {
		if strings.EqualFold(e, s) {
			return true
		}
	}
	return false
}

// readHead reads a start line and the header fields that follow, limit bytes
// at most. It returns io.EOF when nothing at all could be read.
func readHead(br *bufio.Reader, limit int) (start string, h header, err error) {
	n := 0
	readLine := func() (string, error) {
		var line []byte
		for {
			frag, err := br.ReadSlice('\n')
			n += len(frag)
			if n > limit {
				return "", errHeadTooLarge
			}
			line = append(line, frag...)
			if err == nil {
				break
			}
			if err != bufio.ErrBufferFull {
				if err == io.EOF && n > 0 {
					err = io.ErrUnexpectedEOF
				}
				return "", err
			}
		}
		line = line[:len(line)-1]
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		return string(line), nil
	}
	if start, err = readLine(); err != nil {
		return "", nil, err
	}
	if !validText(start) {
		return "", nil, errors.New("invalid character in start line")
	}
	for {
		line, err := readLine()
		if err != nil {
			return "", nil, err
		}
		if line == "" {
			return start, h, nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return "", nil, errors.New("obsolete line folding in header")
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || !isToken(name) {
			return "", nil, fmt.Errorf("malformed header line %q", truncate(line))
		}
		value = strings.Trim(value, " \t")
		if !validText(value) {
			return "", nil, fmt.Errorf("invalid character in header %q", name)
		}
		h = append(h, field{name, value})
	}
}

// validText reports whether s has no control characters other than tab.
func validText(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// isToken reports whether s is an RFC 9110 token (a method or a field name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// request is a parsed request head.
type request struct {
	method, target string
	http11         bool
	header         header
}

func parseRequest(start string, h header) (*request, error) {
	method, rest, ok1 := strings.Cut(start, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !isToken(method) || target == "" || strings.ContainsAny(target, " \t") {
		return nil, fmt.Errorf("malformed request line %q", truncate(start))
	}
	r := &request{method: method, target: target, header: h}
	switch proto {
	case "HTTP/1.1":
		r.http11 = true
	case "HTTP/1.0":
	default:
		return nil, fmt.Errorf("unsupported protocol version %q", truncate(proto))
	}
	return r, nil
}

func (s *Server) serveHTTP(ctx context.Context, set *connSet, cc *clientConn) {
	cc.SetDeadline(time.Now().Add(s.handshakeTimeout()))
	cc.lr.N = maxHeaderBytes + int64(cc.br.Size()) // the reader may run one buffer ahead
	start, h, err := readHead(cc.br, maxHeaderBytes)
	var req *request
	if err == nil {
		req, err = parseRequest(start, h)
	}
	if err != nil {
		switch {
		case errors.Is(err, errHeadTooLarge), cc.lr.N <= 0:
			reject(cc, 431, "request headers are larger than 64 KiB", "")
		case errors.Is(err, io.EOF), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, net.ErrClosed):
			// closed before a request, or stalled: nothing to answer
		default:
			reject(cc, 400, "malformed request: "+err.Error(), "")
		}
		return
	}
	cc.lr.N = 1<<63 - 1
	cc.SetDeadline(time.Time{})
	if req.method == "CONNECT" {
		s.handleConnect(ctx, set, cc, req)
	} else {
		s.handleForward(ctx, set, cc, req)
	}
}

// handleConnect answers CONNECT host:port with 200 and a tunnel.
func (s *Server) handleConnect(ctx context.Context, set *connSet, cc *clientConn, req *request) {
	var hostport string
	if !strings.HasPrefix(req.target, "/") {
		if u, err := url.ParseRequestURI("http://" + req.target); err == nil {
			hostport = u.Host
		}
	}
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil || host == "" {
		reject(cc, 400, fmt.Sprintf("CONNECT needs host:port, got %q", req.target), "")
		return
	}
	port, err := parsePort(portStr)
	if err != nil {
		reject(cc, 400, err.Error(), "")
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
	s.relay(ctx, cc, up, "connect", host, port)
}

// handleForward sends an absolute-URI request to its origin and streams the
// response back.
func (s *Server) handleForward(ctx context.Context, set *connSet, cc *clientConn, req *request) {
	u, err := url.ParseRequestURI(req.target)
	if err != nil || !u.IsAbs() || u.Host == "" {
		reject(cc, 400, fmt.Sprintf("not a proxy request: %q (send an absolute http:// URL, or CONNECT host:port)", req.target), "")
		return
	}
	if u.Scheme != "http" {
		reject(cc, 400, fmt.Sprintf("unsupported scheme %q: send http:// URLs, or CONNECT host:port for https", u.Scheme), "")
		return
	}
	port := 80
	if p := u.Port(); p != "" {
		if port, err = parsePort(p); err != nil {
			reject(cc, 400, err.Error(), "")
			return
		}
	}
	body, err := requestBody(req.header)
	if err != nil {
		reject(cc, 400, "malformed request: "+err.Error(), "")
		return
	}
	up, err := s.connect(ctx, "http", u.Hostname(), port)
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
	if s.Interceptor != nil && s.Interceptor.Binds(u.Hostname(), port) {
		// A host:port a secret is bound to, over plain HTTP: the request
		// goes to the Interceptor as the origin would see it, one per
		// connection as every forwarded request.
		s.intercept(ctx, cc, up, outgoingHead(req, u.Host), u.Hostname(), port)
		return
	}
	// The exchange goes through watched connections (the client's reads
	// too, beneath its buffer), so that it ends when it stalls.
	w := idle.Start(s.idleTimeout(), cc.Conn, up)
	wc := &clientConn{Conn: w.Wrap(cc.Conn), lr: cc.lr, br: cc.br}
	cc.lr.R = wc.Conn
	forward(wc, req, outgoingHead(req, u.Host), body, w.Wrap(up), u.Host)
	cc.lr.R = cc.Conn
	if w.Stop() {
		s.logIdle("http", u.Hostname(), port)
		return
	}
	lingerClose(cc)
}

// outgoingHead is req's head as the origin should see it: origin-form
// target, Host from the URL, no hop-by-hop headers, one request per
// connection.
func outgoingHead(req *request, host string) []byte {
	b := make([]byte, 0, 512)
	b = append(b, req.method...)
	b = append(b, ' ')
	b = append(b, originForm(req.target)...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	b = req.header.withoutHopByHop().without("Host").appendTo(b)
	return append(b, "Connection: close\r\n\r\n"...)
}

// originForm is the path and query of an absolute URI, as sent.
func originForm(target string) string {
	_, rest, _ := strings.Cut(target, "://")
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[i:]
	} else {
		rest = ""
	}
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	return rest
}

// bodyFraming says how a message body ends.
type bodyFraming struct {
	chunked bool
	length  int64 // when not chunked; -1: at the end of the connection
}

// requestBody reads a request's framing from its headers.
func requestBody(h header) (bodyFraming, error) {
	if te := h.values("Transfer-Encoding"); len(te) > 0 {
		if h.has("Content-Length") {
			return bodyFraming{}, errors.New("both Transfer-Encoding and Content-Length")
		}
		if codings := splitList(strings.Join(te, ",")); len(codings) != 1 || !strings.EqualFold(codings[0], "chunked") {
			return bodyFraming{}, fmt.Errorf("unsupported Transfer-Encoding %q", truncate(strings.Join(te, ", ")))
		}
		return bodyFraming{chunked: true}, nil
	}
	n, err := contentLength(h)
	return bodyFraming{length: max(n, 0)}, err
}

// contentLength is the value of h's Content-Length fields, -1 when it has
// none.
func contentLength(h header) (int64, error) {
	cl := h.values("Content-Length")
	if len(cl) == 0 {
		return -1, nil
	}
	for _, v := range cl[1:] {
		if v != cl[0] {
			return 0, errors.New("conflicting Content-Length headers")
		}
	}
	if !isDigits(cl[0]) {
		return 0, fmt.Errorf("invalid Content-Length %q", truncate(cl[0]))
	}
	n, err := strconv.ParseInt(cl[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid Content-Length %q", truncate(cl[0]))
	}
	return n, nil
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// forward writes the request to up (concurrently: an origin may answer
// before it has read the whole body), then passes the origin's response on.
func forward(cc *clientConn, req *request, head []byte, body bodyFraming, up net.Conn, origin string) {
	written := make(chan error, 1)
	go func() { written <- writeRequest(up, head, cc.br, body) }()
	defer func() {
		// Stop the writer if it is still busy: blocked on the origin (closing
		// up ends that) or reading a body the origin did not wait for (an
		// expired read deadline ends that).
		up.Close()
		cc.SetReadDeadline(aLongTimeAgo)
		<-written
		cc.SetReadDeadline(time.Time{})
	}()

	ubr := bufio.NewReader(up)
	for i := 0; ; i++ {
		start, h, err := readHead(ubr, maxResponseHeaderBytes)
		var code int
		if err == nil {
			code, err = parseStatusLine(start)
		}
		if err != nil {
			writeError(cc, 502, fmt.Sprintf("read response from %s: %v", origin, err), "")
			return
		}
		switch {
		case code == 101:
			writeError(cc, 502, fmt.Sprintf("%s switched protocols, which a forwarded request cannot do (use CONNECT)", origin), "")
			return
		case code < 200 && i == maxInformational:
			writeError(cc, 502, fmt.Sprintf("%s sent more than %d informational responses", origin, maxInformational), "")
			return
		case code < 200:
			// An HTTP/1.0 client does not expect informational responses
			// (RFC 9110 section 15.2).
			if req.http11 && writeHead(cc, start, h.withoutHopByHop(), false) != nil {
				return
			}
			continue
		}
		relayResponse(cc, req, start, code, h, ubr)
		return
	}
}

// writeRequest sends the request head, then the body from the client.
func writeRequest(up net.Conn, head []byte, br *bufio.Reader, body bodyFraming) error {
	if _, err := up.Write(head); err != nil {
		return err
	}
	return copyBody(up, br, body, false)
}

// relayResponse passes a final response on, with its body.
func relayResponse(cc *clientConn, req *request, start string, code int, h header, ubr *bufio.Reader) {
	h = h.withoutHopByHop()
	var body bodyFraming
	var decode bool
	if req.method == "HEAD" || code == 204 || code == 304 {
		// no body, whatever the headers say
	} else if te := h.values("Transfer-Encoding"); len(te) > 0 {
		// Transfer-Encoding overrides Content-Length, which may not be sent
		// with it.
		h = h.without("Content-Length")
		codings := splitList(strings.Join(te, ","))
		body.chunked = len(codings) > 0 && strings.EqualFold(codings[len(codings)-1], "chunked")
		if !body.chunked {
			body.length = -1
		} else if !req.http11 {
			// An HTTP/1.0 client cannot read chunks: send the body until
			// close, without the chunked coding (and so without trailers).
			decode = true
			h = h.without("Transfer-Encoding").without("Trailer")
			if rest := codings[:len(codings)-1]; len(rest) > 0 {
				h = append(h, field{"Transfer-Encoding", strings.Join(rest, ", ")})
			}
		}
	} else {
		n, err := contentLength(h)
		if err != nil {
			writeError(cc, 502, "read response: "+err.Error(), "")
			return
		}
		body.length = n
	}
	if writeHead(cc, start, h, true) != nil {
		return
	}
	copyBody(cc.Conn, ubr, body, decode)
}

// parseStatusLine returns the status code of "HTTP/1.x code reason".
func parseStatusLine(line string) (int, error) {
	proto, rest, _ := strings.Cut(line, " ")
	codeStr, _, _ := strings.Cut(rest, " ")
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" || len(codeStr) != 3 || !isDigits(codeStr) || codeStr[0] == '0' {
		return 0, fmt.Errorf("malformed status line %q", truncate(line))
	}
	code, _ := strconv.Atoi(codeStr)
	return code, nil
}

// writeHead writes a response head to the client as HTTP/1.1; final adds
// "Connection: close".
func writeHead(c net.Conn, start string, h header, final bool) error {
	_, status, _ := strings.Cut(start, " ")
	b := make([]byte, 0, 512)
	b = append(b, "HTTP/1.1 "...)
	b = append(b, status...)
	b = append(b, "\r\n"...)
	b = h.appendTo(b)
	if final {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	defer c.SetWriteDeadline(time.Time{})
	_, err := c.Write(b)
	return err
}

// copyBody copies a message body with the given framing from src to dst.
// A chunked body is copied as it is (sizes, extensions, trailers) or, when
// decode is set, as its data alone.
func copyBody(dst io.Writer, src *bufio.Reader, body bodyFraming, decode bool) error {
	switch {
	case body.chunked:
		return copyChunked(dst, src, decode)
	case body.length < 0:
		_, err := io.Copy(dst, src)
		return err
	case body.length > 0:
		n, err := io.CopyN(dst, src, body.length)
		if err == io.EOF && n < body.length {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

// copyChunked copies a chunked body. It parses the chunk sizes, to find the
// end, and nothing else.
func copyChunked(dst io.Writer, src *bufio.Reader, decode bool) error {
	write := func(b []byte) error {
		if decode {
			return nil
		}
		_, err := dst.Write(b)
		return err
	}
	for {
		line, err := readChunkLine(src)
		if err != nil {
			return err
		}
		size, err := parseChunkSize(line)
		if err != nil {
			return err
		}
		if size == 0 {
			// The last chunk is written along with the trailer section.
			return copyTrailers(line, src, write)
		}
		if err := write(line); err != nil {
			return err
		}
		if _, err := io.CopyN(dst, src, size); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		var crlf [2]byte
		if _, err := io.ReadFull(src, crlf[:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if string(crlf[:]) != "\r\n" {
			return errBadChunked
		}
		if err := write(crlf[:]); err != nil {
			return err
		}
	}
}

// copyTrailers writes the last chunk's line and the trailer section after it.
func copyTrailers(last []byte, src *bufio.Reader, write func([]byte) error) error {
	b := append([]byte(nil), last...)
	for {
		line, err := readChunkLine(src)
		if err != nil {
			return err
		}
		b = append(b, line...)
		if len(b) > maxHeaderBytes {
			return errHeadTooLarge
		}
		if len(line) <= 2 && strings.TrimRight(string(line), "\r\n") == "" {
			return write(b)
		}
	}
}

// readChunkLine reads a chunk-size line or a trailer line, line ending
// included. The slice is valid until the next read from br.
func readChunkLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	switch {
	case err == io.EOF:
		return nil, io.ErrUnexpectedEOF
	case err == bufio.ErrBufferFull:
		return nil, errBadChunked // longer than any sensible size line
	}
	return line, err
}

// parseChunkSize parses "hex-size[;extensions]\r\n".
func parseChunkSize(line []byte) (int64, error) {
	s := strings.TrimRight(string(line), "\r\n")
	s, _, _ = strings.Cut(s, ";")
	s = strings.Trim(s, " \t")
	if s == "" || len(s) > 15 {
		return 0, errBadChunked
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return 0, errBadChunked
		}
	}
	return strconv.ParseInt(s, 16, 64)
}

// rejectFailure answers a failed connect: 403 for a refusal, 502 otherwise.
func rejectFailure(cc *clientConn, err error) {
	var re *refusedError
	if errors.As(err, &re) {
		reject(cc, 403, re.v.Reason, re.v.Reason)
		return
	}
	reject(cc, 502, err.Error(), "")
}

// reject writes an error reply and then drops what the client still sends
// for a moment, so it reads the reply rather than a connection reset. The
// caller closes the connection.
func reject(cc *clientConn, code int, msg, policy string) {
	if writeError(cc, code, msg, policy) != nil {
		return
	}
	lingerClose(cc)
}

// lingerClose half-closes the client connection and drops what the client
// still sends for a moment, so that closing it does not reset it before the
// client read the reply. The caller closes the connection.
func lingerClose(cc *clientConn) {
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
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", code, statusText(code))
	if policy != "" {
		fmt.Fprintf(&b, "X-Agentconnect-Policy: %s\r\n", headerValue(policy))
	}
	fmt.Fprintf(&b, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	_, err := io.WriteString(c, b.String())
	return err
}

// statusText is the reason phrase of the codes the proxy answers with.
func statusText(code int) string {
	switch code {
	case 400:
		return "Bad Request"
	case 403:
		return "Forbidden"
	case 431:
		return "Request Header Fields Too Large"
	case 502:
		return "Bad Gateway"
	}
	return "Error"
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
