package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// injectHosts are the bench's HTTPS servers on loopback, one the bench
// secret is bound to and one it is not; the daemon trusts their CA
// (config trustedCAFile), so that the injection verifies the bound one.
type injectHosts struct {
	bound, plain *httptest.Server
	caFile       string
}

func startInjectHosts(dir string) (*injectHosts, error) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	hs := &injectHosts{bound: httptest.NewTLSServer(h), plain: httptest.NewTLSServer(h)}
	hs.caFile = filepath.Join(dir, "bench-ca.pem")
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.bound.Certificate().Raw})
	if err := os.WriteFile(hs.caFile, data, 0o644); err != nil {
		hs.close()
		return nil, err
	}
	return hs, nil
}

func (hs *injectHosts) close() {
	hs.bound.Close()
	hs.plain.Close()
}

func portOfServer(s *httptest.Server) int { return s.Listener.Addr().(*net.TCPAddr).Port }

const injectAgent = "bench-inject"

// benchSrtInject measures what the secret injection adds to a request
// from inside an srt sandbox: curl's time for one HTTPS request on a new
// connection through the proxy, to the bound host (intercepted: two TLS
// handshakes, the swap, redaction) and to a host it is not bound to (a
// plain tunnel), interleaved; and the memory of the session's
// agentconnect-inject process.
func benchSrtInject(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m = "srt secret injection (HTTPS, a connection per request)"
	if d.srtUnavailable != "" {
		rep.note(m, "injected request p50", "unavailable: "+d.srtUnavailable)
		return nil
	}
	if d.inject == nil {
		rep.note(m, "injected request p50", "unavailable: the bench's loopback hosts did not start")
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	bound, plain := portOfServer(d.inject.bound), portOfServer(d.inject.plain)
	if _, err := a.SetSecret(ctx, &adminv1.SetSecretRequest{Name: "bench", Value: "bench-secret-value-0123456789", Hosts: []string{fmt.Sprintf("127.0.0.1:%d", bound)}}); err != nil {
		return err
	}
	n := c.SrtExecs * 2
	// Both without the client's own verification (-k): loading the
	// system's 140 certificates costs curl ~40 ms per process whichever
	// way it goes, which would hide what the proxy adds. (Integration
	// tests verify the session CA.)
	script := fmt.Sprintf(`for i in $(seq %d); do
  printf 'b '; curl -sk --noproxy '' -o /dev/null -w '%%{time_total}\n' -H "X-Api-Key: $KEY" https://127.0.0.1:%d/ || echo fail
  printf 'p '; curl -sk --noproxy '' -o /dev/null -w '%%{time_total}\n' -H "X-Api-Key: $KEY" https://127.0.0.1:%d/ || echo fail
done`, n, bound, plain)
	if _, err := a.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: &adminv1.Agent{
		Name: injectAgent, Strategy: "srt", Command: []string{"sh", "-c", script},
		Secrets:        []*adminv1.SecretBinding{{Env: "KEY", Secret: "bench"}},
		AllowedDomains: []string{fmt.Sprintf("127.0.0.1:%d", bound), fmt.Sprintf("127.0.0.1:%d", plain)},
	}}); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, d.path("agentconnect"), "--home", d.home, "exec", injectAgent)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("exec %s: %v: %s", injectAgent, err, strings.TrimSpace(stderr.String()))
	}
	var injected, tunnelled samples
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		kind, secs, _ := strings.Cut(sc.Text(), " ")
		v, err := strconv.ParseFloat(secs, 64)
		if err != nil {
			return fmt.Errorf("curl inside the sandbox: %q", sc.Text())
		}
		d := time.Duration(v * float64(time.Second))
		if kind == "b" {
			injected.add(d)
		} else {
			tunnelled.add(d)
		}
	}
	note := fmt.Sprintf("n=%d each, interleaved; curl -k's time_total from inside: CONNECT, TLS, one GET", len(injected))
	rep.add(m, "injected request p50", injected.median(), "ms", 0, note)
	rep.add(m, "injected request p99", injected.percentile(99), "ms", 0, "")
	rep.add(m, "plain tunnel p50", tunnelled.median(), "ms", 0, "the same server, on a port the secret is not bound to")
	rep.add(m, "plain tunnel p99", tunnelled.percentile(99), "ms", 0, "")
	rep.add(m, "added by injection p50", injected.median()-tunnelled.median(), "ms", 0, "a second TLS handshake, the swap and the redaction")

	// Memory: an idle session with a binding, after one injected request.
	idle, err := a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: injectAgent, Command: []string{"sh", "-c",
		fmt.Sprintf(`curl -s --noproxy '' -o /dev/null -H "X-Api-Key: $KEY" https://127.0.0.1:%d/; exec sleep 600`, bound)}})
	if err != nil {
		return err
	}
	defer removeSessions(ctx, a, []*adminv1.Session{idle})
	select {
	case <-time.After(shimIdle):
	case <-ctx.Done():
		return ctx.Err()
	}
	s, err := a.GetSession(ctx, &adminv1.GetSessionRequest{Id: idle.Id})
	if err != nil {
		return err
	}
	procs := leftovers.ReadProcs()
	for _, pid := range leftovers.Descendants(leftovers.ChildrenOf(procs), int(s.ShimPid), int(s.Pid)) {
		if procs[pid].Name() != "agentconnect-in" && !strings.HasPrefix(procs[pid].Name(), "agentconnect-inject") {
			continue
		}
		roll, err := readSmapsRollup(pid)
		if err != nil {
			return err
		}
		rep.add(m, "agentconnect-inject RSS", float64(roll["Rss"])/1024, "MiB", 0, "per session with secrets, idle after one request")
		rep.add(m, "agentconnect-inject PSS", float64(roll["Pss"])/1024, "MiB", 0, "")
		return nil
	}
	rep.note(m, "agentconnect-inject RSS", "no agentconnect-inject process under the session's shim")
	return nil
}
