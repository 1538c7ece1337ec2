package vmnet

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/inject"
)

// TestInterceptsBoundHosts: the guest's connections to a host:port a
// secret is bound to go through the Interceptor (a real injector here),
// over TLS and, where the port is named, plain HTTP, with the value put on
// the wire and its echo redacted; an allowed connection to an unbound port
// is relayed untouched, as is every connection before the interceptor is
// set (a warm VM's network before its claim). The guest dials HostIP
// without resolving it: the address is HostName all the same.
func TestInterceptsBoundHosts(t *testing.T) {
	const value, placeholder = "sk-real-value-42", "agentconnect-placeholder-0123456789abcdef0123456789abcdef"
	got := make(chan string, 4)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("X-Api-Key")
		io.WriteString(w, "saw "+r.Header.Get("X-Api-Key"))
	})
	tlsHost := httptest.NewTLSServer(handler)
	defer tlsHost.Close()
	plainHost := httptest.NewServer(handler)
	defer plainHost.Close()
	_, echoPort := echoTCP(t)
	tlsPort, plainPort := tlsHost.Listener.Addr().(*net.TCPAddr).Port, plainHost.Listener.Addr().(*net.TCPAddr).Port

	roots := x509.NewCertPool()
	roots.AddCert(tlsHost.Certificate())
	in, err := inject.New(inject.Config{Logf: t.Logf, RootCAs: roots, Secrets: []inject.Secret{{
		Placeholder: placeholder, Value: value,
		Hosts: []string{HostName + ":" + strconv.Itoa(tlsPort), HostName + ":" + strconv.Itoa(plainPort)},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	var allowed []string
	for _, p := range []int{tlsPort, plainPort, echoPort} {
		allowed = append(allowed, "127.0.0.1:"+strconv.Itoa(p))
	}
	st := &setup{res: defaultResolver(), rec: &recorder{}}
	st.attach(t, Config{Policy: mustPolicy(t, allowed, nil), Resolver: st.res, OnViolation: st.rec.add, Logf: t.Logf})

	trusted := x509.NewCertPool()
	trusted.AppendCertsFromPEM(in.CACertPEM())
	roundTrip := func(c net.Conn, port int) (int, string) {
		t.Helper()
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		req, _ := http.NewRequest("GET", "http://"+net.JoinHostPort(HostName, strconv.Itoa(port))+"/", nil)
		req.Header.Set("X-Api-Key", placeholder)
		if err := req.Write(c); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	check := func(what string, code int, body string) {
		t.Helper()
		if code != 200 || body != "saw "+placeholder {
			t.Errorf("%s: %d %q, want the placeholder's echo", what, code, body)
		}
		select {
		case h := <-got:
			if h != value {
				t.Errorf("%s: the host got %q, want the value", what, h)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the host got nothing", what)
		}
	}

	c, err := st.g.dialTCP(HostIP, plainPort)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := roundTrip(c, plainPort); code != 200 || body != "saw "+placeholder || <-got != placeholder {
		t.Errorf("before SetInterceptor: %d %q, want the placeholder relayed untouched", code, body)
	}
	st.n.SetInterceptor(in)

	c, err = st.g.dialTCP(HostIP, tlsPort)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: HostName, RootCAs: trusted})
	code, body := roundTrip(tc, tlsPort)
	check("https", code, body)

	c, err = st.g.dialTCP(HostIP, plainPort)
	if err != nil {
		t.Fatal(err)
	}
	code, body = roundTrip(c, plainPort)
	check("plain http", code, body)

	c, err = st.g.dialTCP(HostIP, echoPort)
	if err != nil {
		t.Fatal(err)
	}
	echo(t, c, "GET / HTTP/1.1\r\nX-Api-Key: "+placeholder+"\r\n\r\n")
	if vs := st.rec.all(); len(vs) != 0 {
		t.Errorf("violations: %+v", vs)
	}
	if strings.Contains(body, value) {
		t.Error("the value came back")
	}
}
