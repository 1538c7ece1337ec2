package proxy_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/inject"
	"github.com/agentconnect-md/agentconnect/strategy/srt/proxy"
)

// TestInterceptsOnlyBoundHosts: a tunnel to a host:port a secret is bound
// to goes through the Interceptor, which swaps the placeholder; a tunnel
// to any other destination is relayed untouched, its placeholder with it.
func TestInterceptsOnlyBoundHosts(t *testing.T) {
	const value, placeholder = "sk-real-value-42", "agentconnect-placeholder-0123456789abcdef0123456789abcdef"
	got := make(chan string, 2)
	newHost := func() *httptest.Server {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- r.Header.Get("X-Api-Key")
		}))
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv
	}
	bound, other := newHost(), newHost()
	boundPort, otherPort := portOf(t, bound.Listener.Addr().String()), portOf(t, other.Listener.Addr().String())
	roots := x509.NewCertPool()
	roots.AddCert(bound.Certificate())
	roots.AddCert(other.Certificate())
	in, err := inject.New(inject.Config{Logf: t.Logf, RootCAs: roots, Secrets: []inject.Secret{{
		Placeholder: placeholder, Value: value, Hosts: []string{"example.com:" + strconv.Itoa(boundPort)},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e := startProxy(t, nil, nil, map[string][]netip.Addr{"example.com": {netip.MustParseAddr("192.31.196.7")}},
		func(s *proxy.Server) { s.Interceptor = in })

	trusted := roots.Clone()
	trusted.AppendCertsFromPEM(in.CACertPEM())
	proxyURL, _ := url.Parse("http://" + e.addr)
	client := &http.Client{Timeout: ioTimeout, Transport: &http.Transport{
		Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: trusted},
	}}
	for port, want := range map[int]string{boundPort: value, otherPort: placeholder} {
		req, _ := http.NewRequest("GET", "https://example.com:"+strconv.Itoa(port)+"/", nil)
		req.Header.Set("X-Api-Key", placeholder)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		select {
		case h := <-got:
			if h != want {
				t.Errorf("example.com:%d received X-Api-Key %q, want %q", port, h, want)
			}
		case <-time.After(ioTimeout):
			t.Fatalf("example.com:%d received nothing", port)
		}
	}
}

// TestInterceptsPlainHTTPToAnExplicitPort: a forwarded http:// request to a
// host:port a secret names explicitly goes through the Interceptor (the
// value reaches the host, its echo comes back as the placeholder); the same
// host on another port is forwarded untouched.
func TestInterceptsPlainHTTPToAnExplicitPort(t *testing.T) {
	const value, placeholder = "sk-real-value-42", "agentconnect-placeholder-0123456789abcdef0123456789abcdef"
	got := make(chan string, 2)
	newHost := func() *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- r.Header.Get("X-Api-Key")
			io.WriteString(w, r.Header.Get("X-Api-Key"))
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	bound, other := newHost(), newHost()
	boundPort, otherPort := portOf(t, bound.Listener.Addr().String()), portOf(t, other.Listener.Addr().String())
	in, err := inject.New(inject.Config{Logf: t.Logf, Secrets: []inject.Secret{{
		Placeholder: placeholder, Value: value, Hosts: []string{"gateway.example.com:" + strconv.Itoa(boundPort)},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	e := startProxy(t, nil, nil, map[string][]netip.Addr{"gateway.example.com": {netip.MustParseAddr("192.31.196.7")}},
		func(s *proxy.Server) { s.Interceptor = in })
	proxyURL, _ := url.Parse("http://" + e.addr)
	client := &http.Client{Timeout: ioTimeout, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
	for port, want := range map[int]string{boundPort: value, otherPort: placeholder} {
		for i := 0; i < 2; i++ { // a second request: one connection each
			req, _ := http.NewRequest("POST", "http://gateway.example.com:"+strconv.Itoa(port)+"/", strings.NewReader("a body"))
			req.Header.Set("X-Api-Key", placeholder)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("port %d: %v", port, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != placeholder {
				t.Errorf("port %d: %d %q, want the placeholder back", port, resp.StatusCode, body)
			}
			select {
			case h := <-got:
				if h != want {
					t.Errorf("gateway.example.com:%d received X-Api-Key %q, want %q", port, h, want)
				}
			case <-time.After(ioTimeout):
				t.Fatalf("gateway.example.com:%d received nothing", port)
			}
		}
	}
}
