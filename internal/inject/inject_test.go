package inject

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

const (
	value       = "sk-real-VALUE-1234567890"
	placeholder = "agentconnect-placeholder-00112233445566778899aabbccddeeff"
	otherValue  = "ghp-other-VALUE-abcdef"
	otherPH     = "agentconnect-placeholder-ffeeddccbbaa99887766554433221100"
)

// echoHost is a bound host's stand-in: it answers with the request's
// headers, in its body and in a response header, as an echo service
// would, gzip-encoded when asked for /gzip.
func echoHost(t *testing.T) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var lines []string
		for k, v := range r.Header {
			lines = append(lines, k+": "+strings.Join(v, ","))
		}
		sort.Strings(lines)
		body := []byte(r.Proto + "\n" + strings.Join(lines, "\n") + "\n")
		w.Header().Set("X-Echo", r.Header.Get("X-Api-Key"))
		if r.URL.Path == "/gzip" {
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			zw.Write(body)
			zw.Close()
			w.Header().Set("Content-Encoding", "gzip")
			body = buf.Bytes()
		}
		w.Write(body)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// session starts an injector for the secrets and a proxy stand-in on
// loopback that hands every connection to Intercept for example.com:443,
// dialed to upstream; it returns a client of the session's side.
func session(t *testing.T, upstream *httptest.Server, roots *x509.CertPool, h2 bool, secrets ...Secret) (*http.Client, *Injector, chan error, string) {
	t.Helper()
	if roots == nil {
		roots = x509.NewCertPool()
		roots.AddCert(upstream.Certificate())
	}
	in, err := New(Config{Secrets: secrets, RootCAs: roots, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	addr, done := proxyStandIn(t, in, upstream.Listener.Addr().String(), []string{"example.com"}, 443)
	trusted := x509.NewCertPool()
	if !trusted.AppendCertsFromPEM(in.CACertPEM()) {
		t.Fatal("the session CA's PEM does not parse")
	}
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp", addr) },
		TLSClientConfig:   &tls.Config{RootCAs: trusted},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}, in, done, addr
}

// proxyStandIn listens on loopback and serves each connection with Serve,
// for hosts and port, dialled to upstream; Serve's results arrive on done.
func proxyStandIn(t *testing.T, in *Injector, upstream string, hosts []string, port int) (addr string, done chan error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	done = make(chan error, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				c.Close()
				done <- err
				continue
			}
			go func() { done <- in.Serve(context.Background(), c, nil, up, hosts, port) }()
		}
	}()
	return l.Addr().String(), done
}

func get(t *testing.T, c *http.Client, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var anthropic = Secret{Placeholder: placeholder, Value: value, Hosts: []string{"example.com"}, Headers: []string{"x-api-key", "authorization"}}

// TestSwapsTowardTheBoundHostOnly: the host gets the value in the headers
// the secret allows, a Basic credential included; a header it does not
// allow, and another host's secret, keep their placeholders; nothing the
// host sends back holds the value. Over HTTP/1.1 and HTTP/2.
func TestSwapsTowardTheBoundHostOnly(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			up := echoHost(t)
			other := Secret{Placeholder: otherPH, Value: otherValue, Hosts: []string{"github.com"}}
			c, in, _, _ := session(t, up, nil, h2, anthropic, other)
			// A host named without a port is bound on 443 only: SSH to it
			// is no HTTPS.
			if !in.Binds("example.com", 443) || in.Binds("example.org", 443) || !in.Binds("github.com", 443) || in.Binds("github.com", 22) {
				t.Errorf("Binds: example.com %v, example.org %v, github.com %v, github.com:22 %v", in.Binds("example.com", 443), in.Binds("example.org", 443), in.Binds("github.com", 443), in.Binds("github.com", 22))
			}
			basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+placeholder))
			resp, body := get(t, c, "https://example.com/", map[string]string{
				"X-Api-Key": placeholder, "Authorization": basic, "X-Other": placeholder, "X-Github": otherPH,
			})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if want := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; resp.Proto != want {
				t.Errorf("the session's side spoke %s, want %s", resp.Proto, want)
			}
			if !strings.HasPrefix(body, "HTTP/2.0") {
				t.Errorf("the host's side spoke %q, want HTTP/2.0 (it offers it)", strings.SplitN(body, "\n", 2)[0])
			}
			// What the host received, as the echo shows it (redacted).
			for _, want := range []string{
				"X-Api-Key: " + placeholder, // swapped on the way out, back in the echo
				"X-Other: " + placeholder,   // not a header the secret may travel in
				"X-Github: " + otherPH,      // another host's secret
				"Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+placeholder)),
			} {
				if !strings.Contains(body, want) {
					t.Errorf("echo lacks %q:\n%s", want, body)
				}
			}
			if strings.Contains(body, value) || resp.Header.Get("X-Echo") != placeholder {
				t.Errorf("the value came back: X-Echo %q, body:\n%s", resp.Header.Get("X-Echo"), body)
			}
			// gzip is decoded, so that it is redacted too.
			resp, body = get(t, c, "https://example.com/gzip", map[string]string{"X-Api-Key": placeholder, "Accept-Encoding": "gzip"})
			if strings.Contains(body, value) || !strings.Contains(body, "X-Api-Key: "+placeholder) || resp.Header.Get("Content-Encoding") != "" {
				t.Errorf("gzip answer: %v\n%s", resp.Header, body)
			}
		})
	}
}

// TestTheHostReceivesTheValue checks the swap at the host itself, not
// through its (redacted) echo.
func TestTheHostReceivesTheValue(t *testing.T) {
	got := make(chan http.Header, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	up.StartTLS()
	defer up.Close()
	c, _, _, _ := session(t, up, nil, false, anthropic)
	get(t, c, "https://example.com/", map[string]string{
		"X-Api-Key": placeholder, "Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+placeholder)),
	})
	h := <-got
	if h.Get("X-Api-Key") != value {
		t.Errorf("the host got X-Api-Key %q, want the value", h.Get("X-Api-Key"))
	}
	if raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(h.Get("Authorization"), "Basic ")); string(raw) != "u:"+value {
		t.Errorf("the host got Basic %q, want u:<value>", raw)
	}
}

// TestRefusals: a Host or a TLS server name other than the connection's
// target gets nothing.
func TestRefusals(t *testing.T) {
	up := echoHost(t)
	c, _, done, addr := session(t, up, nil, false, anthropic)
	resp, body := get(t, c, "https://example.com/", map[string]string{"Host": "api.example.com", "X-Api-Key": placeholder})
	if resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, value) {
		t.Errorf("a Host other than the tunnel's: %d %s", resp.StatusCode, body)
	}
	// The client's own check is off: the refusal must be the injector's.
	conn, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "api.example.com", InsecureSkipVerify: true})
	if err == nil {
		conn.Close()
		t.Error("a TLS server name other than the tunnel's was served")
	}
	// The first connection (the Host test's) ends without an error; the
	// second must end with the refusal.
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-done:
			if err == nil {
				continue
			}
			if !strings.Contains(err.Error(), `"api.example.com" is not example.com`) {
				t.Errorf("Intercept: %v", err)
			}
			return
		case <-deadline:
			t.Fatal("Intercept did not refuse the other server name")
		}
	}
}

// TestUnverifiedHostGetsNothing: the host's certificate is checked against
// the trust store given; one that does not verify is refused, with a reason
// the session's client can read, and no request reaches it.
func TestUnverifiedHostGetsNothing(t *testing.T) {
	reached := make(chan struct{}, 1)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached <- struct{}{} }))
	up.StartTLS()
	defer up.Close()
	for _, h2 := range []bool{false, true} {
		c, _, done, _ := session(t, up, x509.NewCertPool(), h2, anthropic)
		resp, body := get(t, c, "https://example.com/", map[string]string{"X-Api-Key": placeholder})
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "did not prove who it is") {
			t.Errorf("an unverified host, h2=%v: %d %q", h2, resp.StatusCode, body)
		}
		if err := <-done; err == nil || !strings.Contains(err.Error(), "TLS upstream") {
			t.Errorf("Intercept, h2=%v: %v", h2, err)
		}
	}
	select {
	case <-reached:
		t.Error("a request reached a host whose certificate did not verify")
	default:
	}
}

func TestRedactorAcrossReads(t *testing.T) {
	secrets := [][2][]byte{{[]byte(value), []byte(placeholder)}}
	in := "a" + value + "b" + value[:5] + "c" + value
	out, err := io.ReadAll(newRedactor(iotest.OneByteReader(strings.NewReader(in)), secrets))
	if want := "a" + placeholder + "b" + value[:5] + "c" + placeholder; err != nil || string(out) != want {
		t.Errorf("redacted %q, want %q (%v)", out, want, err)
	}
	// A line's end is passed on at once: a stream is not held up.
	pr, pw := io.Pipe()
	r := newRedactor(pr, secrets)
	go pw.Write([]byte("data: {}\n\n"))
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	if string(buf[:n]) != "data: {}\n\n" {
		t.Errorf("first read %q, want the whole event", buf[:n])
	}
	pw.Close()
}

// TestCAVouchesOnlyForBoundHosts: the session CA's name constraints keep a
// certificate it signed for another host from verifying.
func TestCAVouchesOnlyForBoundHosts(t *testing.T) {
	in, err := New(Config{Secrets: []Secret{anthropic}})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(in.CACertPEM())
	caCert, _ := x509.ParseCertificate(block.Bytes)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	for host, ok := range map[string]bool{"example.com": true, "api.example.com": true, "example.org": false} {
		leaf, err := in.ca.leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		cert, _ := x509.ParseCertificate(leaf.Certificate[0])
		_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
		if (err == nil) != ok {
			t.Errorf("a leaf for %s: verify error %v, want ok=%v", host, err, ok)
		}
	}
}

// TestUpgradePasses: a WebSocket-style upgrade is relayed both ways; what
// the host sends on it is redacted too.
func TestUpgradePasses(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo " + line + value + "\n")
		brw.Flush()
	}))
	up.StartTLS() // HTTP/1.1 only: upgrades are HTTP/1.1's
	defer up.Close()
	c, _, _, _ := session(t, up, nil, false, anthropic)
	req, _ := http.NewRequest("GET", "https://example.com/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	// The transport itself: a client's timeout wraps the body.
	resp, err := c.Transport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		t.Fatalf("upgrade: %d, writable body %v", resp.StatusCode, ok)
	}
	io.WriteString(rw, "hi\n")
	got, _ := io.ReadAll(io.LimitReader(rw, 200))
	if want := "echo hi\n" + placeholder + "\n"; string(got) != want {
		t.Errorf("over the upgrade: %q, want %q", got, want)
	}
}

// TestPlainHTTPOnlyWhereBoundExplicitly: plain HTTP to a host:port a secret
// names is injected (and redacted back), keep-alive included; plain HTTP to
// a host bound for HTTPS only is refused, and nothing reaches it.
func TestPlainHTTPOnlyWhereBoundExplicitly(t *testing.T) {
	got := make(chan http.Header, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Clone()
		w.Header().Set("X-Echo", r.Header.Get("X-Api-Key"))
		io.WriteString(w, "saw "+r.Header.Get("X-Api-Key"))
	}))
	defer up.Close()
	gateway := Secret{Placeholder: placeholder, Value: value, Hosts: []string{"gateway.test:8080", "example.com"}}
	in, err := New(Config{Secrets: []Secret{gateway}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if !in.Binds("gateway.test", 8080) || in.Binds("gateway.test", 80) || !in.bound("gateway.test", 8080, true) || in.bound("example.com", 443, true) {
		t.Fatal("Binds or bound judge the explicit port wrong")
	}
	addr, _ := proxyStandIn(t, in, up.Listener.Addr().String(), []string{"gateway.test"}, 8080)
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp", addr) }}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for i := 0; i < 2; i++ { // the second on the same connection
		resp, body := get(t, c, "http://gateway.test:8080/", map[string]string{"X-Api-Key": placeholder})
		if h := <-got; h.Get("X-Api-Key") != value {
			t.Errorf("request %d: the gateway got %q, want the value", i, h.Get("X-Api-Key"))
		}
		if resp.StatusCode != 200 || body != "saw "+placeholder || resp.Header.Get("X-Echo") != placeholder {
			t.Errorf("request %d: %d %q X-Echo %q", i, resp.StatusCode, body, resp.Header.Get("X-Echo"))
		}
	}
	resp, body := get(t, c, "http://other.test:8080/", map[string]string{"X-Api-Key": placeholder})
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("another Host on the gateway's connection: %d %s", resp.StatusCode, body)
	}

	addr, done := proxyStandIn(t, in, up.Listener.Addr().String(), []string{"example.com"}, 443)
	resp, body = get(t, c, "http://"+addr+"/", map[string]string{"Host": "example.com:443", "X-Api-Key": placeholder})
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "bound for HTTPS only") {
		t.Errorf("plain HTTP to a host bound for HTTPS: %d %q", resp.StatusCode, body)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "plain HTTP") {
		t.Errorf("Serve: %v", err)
	}
	select {
	case <-got:
		t.Error("plain HTTP to a host bound for HTTPS only reached it")
	default:
	}
}

// TestServerNamePicksAmongHosts: where an address stands for several bound
// names (the VM's network knows only the address), the TLS server name
// picks one of them, and only one of them.
func TestServerNamePicksAmongHosts(t *testing.T) {
	got := make(chan string, 2)
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Host + " " + r.Header.Get("X-Api-Key") }))
	up.StartTLS()
	defer up.Close()
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	both := Secret{Placeholder: placeholder, Value: value, Hosts: []string{"example.org", "example.com"}}
	in, err := New(Config{Secrets: []Secret{both}, RootCAs: roots, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	addr, done := proxyStandIn(t, in, up.Listener.Addr().String(), []string{"example.org", "example.com"}, 443)
	trusted := x509.NewCertPool()
	trusted.AppendCertsFromPEM(in.CACertPEM())
	tr := &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp", addr) },
		TLSClientConfig: &tls.Config{RootCAs: trusted},
	}
	defer tr.CloseIdleConnections()
	// The stand-in's upstream has a certificate for example.com only.
	resp, body := get(t, &http.Client{Transport: tr, Timeout: 10 * time.Second}, "https://example.com/", map[string]string{"X-Api-Key": placeholder})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if h := <-got; h != "example.com "+value {
		t.Errorf("the host got %q", h)
	}
	if _, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "example.net", RootCAs: trusted}); err == nil {
		t.Error("a server name none of the hosts has was served")
	}
	tr.CloseIdleConnections() // ends the first connection's Serve
	var refused bool
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			refused = strings.Contains(err.Error(), `"example.net" is not example.org or example.com`)
			if !refused {
				t.Errorf("Serve: %v", err)
			}
		}
	}
	if !refused {
		t.Error("Serve did not refuse the other server name")
	}
}

// TestRenewal: a refresh grant carries the refresh token's placeholder in
// its body, which the token endpoint receives as the value; the new tokens
// of its answer become the secrets' values (reported by OnUpdate) and reach
// the session as the placeholders, so the next refresh and the API calls
// work with what the session holds, several times over.
func TestRenewal(t *testing.T) {
	var mu sync.Mutex
	access, refresh, n := "real-access-0", "real-refresh-0", 0
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch r.URL.Path {
		case "/token":
			var grant struct {
				RefreshToken string `json:"refresh_token"`
			}
			json.NewDecoder(r.Body).Decode(&grant)
			if grant.RefreshToken != refresh {
				http.Error(w, `{"error":"invalid_grant"}`, 400)
				return
			}
			n++
			access, refresh = fmt.Sprintf("real-access-%d", n), fmt.Sprintf("real-refresh-%d", n)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"access_token":%q,"refresh_token":%q,"expires_in":2,"token_type":"Bearer"}`, access, refresh)
		default:
			if r.Header.Get("Authorization") != "Bearer "+access {
				http.Error(w, "bad token "+r.Header.Get("Authorization"), http.StatusUnauthorized)
				return
			}
			io.WriteString(w, "hello "+access)
		}
	}))
	up.StartTLS()
	defer up.Close()
	const accessPH, refreshPH = "agentconnect-placeholder-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "agentconnect-placeholder-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	updates := make(chan [2]string, 16)
	roots := x509.NewCertPool()
	roots.AddCert(up.Certificate())
	in, err := New(Config{RootCAs: roots, Logf: t.Logf, OnUpdate: func(ph, v string) { updates <- [2]string{ph, v} }, Secrets: []Secret{
		{Placeholder: accessPH, Value: "real-access-0", Hosts: []string{"example.com"}, Headers: []string{"authorization"}, TokenHosts: []string{"example.com"}, TokenField: "access_token"},
		{Placeholder: refreshPH, Value: "real-refresh-0", TokenHosts: []string{"example.com"}, TokenField: "refresh_token"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := proxyStandIn(t, in, up.Listener.Addr().String(), []string{"example.com"}, 443)
	trusted := x509.NewCertPool()
	trusted.AppendCertsFromPEM(in.CACertPEM())
	tr := &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) { return net.Dial("tcp", addr) },
		TLSClientConfig: &tls.Config{RootCAs: trusted}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	heldAccess, heldRefresh := accessPH, refreshPH // what the session holds
	for i := 1; i <= 3; i++ {
		resp, err := c.Post("https://example.com/token", "application/json", strings.NewReader(`{"grant_type":"refresh_token","refresh_token":"`+heldRefresh+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		var answer struct {
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
			ExpiresIn    int    `json:"expires_in"`
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || json.Unmarshal(b, &answer) != nil {
			t.Fatalf("refresh %d: %d %s", i, resp.StatusCode, b)
		}
		if strings.Contains(string(b), "real-") || answer.AccessToken != accessPH || answer.RefreshToken != refreshPH || answer.ExpiresIn != 2 {
			t.Fatalf("refresh %d answered %s, want the placeholders and the rest", i, b)
		}
		heldAccess, heldRefresh = answer.AccessToken, answer.RefreshToken
		got := map[string]string{}
		for range 2 {
			u := <-updates
			got[u[0]] = u[1]
		}
		if got[accessPH] != fmt.Sprintf("real-access-%d", i) || got[refreshPH] != fmt.Sprintf("real-refresh-%d", i) {
			t.Errorf("refresh %d reported %v", i, got)
		}
		r, body := get(t, c, "https://example.com/api", map[string]string{"Authorization": "Bearer " + heldAccess})
		if r.StatusCode != 200 || body != "hello "+accessPH {
			t.Errorf("the API after refresh %d: %d %q", i, r.StatusCode, body)
		}
	}
	// An old value's echo is redacted too.
	r, body := get(t, c, "https://example.com/api", map[string]string{"Authorization": "Bearer real-access-1"})
	if r.StatusCode != 401 || strings.Contains(body, "real-access-1") {
		t.Errorf("an old token's echo: %d %q", r.StatusCode, body)
	}
	if _, err := New(Config{Secrets: []Secret{{Placeholder: refreshPH, Value: "x", TokenHosts: []string{"example.com"}, TokenField: "password"}}}); err == nil {
		t.Error("a token field that is none was accepted")
	}
}
