package integration

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeOAuth is a provider whose tokens last 2 seconds: its token endpoint
// takes the current refresh token once (rotation) and answers with new
// tokens; its API takes the current access token while it lasts.
type fakeOAuth struct {
	mu        sync.Mutex
	n         int
	access    string
	refresh   string
	expires   time.Time
	refreshes int
	apiOK     int
	refused   []string // what it refused, and why
}

func newFakeOAuth() *fakeOAuth {
	return &fakeOAuth{access: "real-access-0", refresh: "real-refresh-0", expires: time.Now().Add(2 * time.Second)}
}

func (f *fakeOAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/oauth/token":
		var grant struct {
			GrantType    string `json:"grant_type"`
			RefreshToken string `json:"refresh_token"`
		}
		json.NewDecoder(r.Body).Decode(&grant)
		if grant.GrantType != "refresh_token" || grant.RefreshToken != f.refresh {
			f.refused = append(f.refused, "refresh with "+grant.RefreshToken)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprint(w, `{"error":"invalid_grant"}`)
			return
		}
		f.n++
		f.refreshes++
		f.access, f.refresh = fmt.Sprintf("real-access-%d", f.n), fmt.Sprintf("real-refresh-%d", f.n)
		f.expires = time.Now().Add(2 * time.Second)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"token_type":"Bearer","access_token":%q,"refresh_token":%q,"expires_in":2,"scope":"user:inference"}`, f.access, f.refresh)
	case "/v1/me":
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if got != f.access || time.Now().After(f.expires) {
			f.refused = append(f.refused, "api with "+got)
			http.Error(w, "token expired or unknown: "+got, http.StatusUnauthorized)
			return
		}
		f.apiOK++
		fmt.Fprintf(w, "hello, holder of %s\n", got)
	default:
		http.NotFound(w, r)
	}
}

// oauthClient is a runtime-like client: like Claude Code it reads its
// login from ~/.claude/.credentials.json, refreshes it at its token
// endpoint when it is about to expire, writes the new tokens back, and
// calls the API with the access token; through the proxy (HTTPS_PROXY) and
// the boundary's trust store (SSL_CERT_FILE), as a runtime does. At the end
// it prints what it holds.
const oauthClient = `
import json, os, sys, time, urllib.request
base = sys.argv[1]
path = os.path.expanduser("~/.claude/.credentials.json")
def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.load(r)
refreshes = 0
end = time.time() + 9
while time.time() < end:
    creds = json.load(open(path))
    o = creds["claudeAiOauth"]
    if o["expiresAt"] < (time.time() + 0.7) * 1000:
        t = post(base + "/v1/oauth/token", {"grant_type": "refresh_token", "refresh_token": o["refreshToken"], "client_id": "test"})
        o["accessToken"], o["refreshToken"] = t["access_token"], t["refresh_token"]
        o["expiresAt"] = int((time.time() + t["expires_in"]) * 1000)
        json.dump(creds, open(path, "w"))
        refreshes += 1
    req = urllib.request.Request(base + "/v1/me", headers={"Authorization": "Bearer " + o["accessToken"]})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            print("api", r.status, r.read().decode().strip(), flush=True)
    except urllib.error.HTTPError as e:
        print("api", e.code, e.read().decode().strip(), flush=True)
    time.sleep(0.5)
print("refreshes", refreshes)
print("file", open(path).read())
print("env", " ".join(k + "=" + v for k, v in sorted(os.environ.items())))
`

// TestOAuthRefreshThroughTheProxy: an agent logged in from a credentials
// file (agent login --from-file) refreshes its 2-second tokens several times
// inside srt through the session's proxy: the token endpoint receives the
// real refresh token, the API the real access token, and the boundary only
// ever holds placeholders; the store keeps the newest tokens, so that the
// next session goes on with them.
func TestOAuthRefreshThroughTheProxy(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	provider := newFakeOAuth()
	srv := httptest.NewTLSServer(provider)
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	hostPort := fmt.Sprintf("host.agentconnect.internal:%d", port)
	caFile := filepath.Join(t.TempDir(), "provider-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"}`)
	startDaemon(t, home)

	clientDir := t.TempDir()
	os.WriteFile(filepath.Join(clientDir, "client.py"), []byte(oauthClient), 0o644)
	ok(t, home, "agent", "create", "claude", "--strategy", "srt", "--allow-domain", hostPort,
		"--mount", clientDir+":/opt/client:ro", "--", "/usr/bin/python3", "/opt/client/client.py", "https://"+hostPort)
	creds := filepath.Join(t.TempDir(), "credentials.json")
	os.WriteFile(creds, []byte(fmt.Sprintf(`{"claudeAiOauth":{"accessToken":"real-access-0","refreshToken":"real-refresh-0","expiresAt":%d,"scopes":["user:inference"],"subscriptionType":"max"}}`,
		provider.expires.UnixMilli())), 0o600)
	out := ok(t, home, "agent", "login", "claude", "--runtime", "claude", "--from-file", creds, "--api-host", hostPort, "--token-host", hostPort)
	if !strings.Contains(out, "claude-claude-access, claude-claude-refresh") {
		t.Errorf("agent login: %s", out)
	}
	if show := ok(t, home, "agent", "show", "claude"); !strings.Contains(show, "login:") || strings.Contains(show, "real-") {
		t.Errorf("agent show:\n%s", show)
	}
	if ls := ok(t, home, "secret", "ls"); !strings.Contains(ls, hostPort+" (renews its refresh_token)") || !strings.Contains(ls, "claude-claude-access") {
		t.Errorf("secret ls:\n%s", ls)
	}
	if r := run(t, home, "", "secret", "rm", "claude-claude-refresh"); r.code == 0 || !strings.Contains(r.stderr, "bound to agent claude") {
		t.Errorf("secret rm of a login's secret: %+v", r)
	}

	check := func(run int) {
		t.Helper()
		id := strings.TrimSpace(ok(t, home, "session", "start", "claude"))
		s := waitSession(t, home, id)
		logs := ok(t, home, "session", "logs", id)
		if s.State != "exited" || s.ExitCode != 0 {
			t.Fatalf("run %d: %s %d %s\n%s\n%s", run, s.State, s.ExitCode, s.Reason, logs, shimLog(home, id))
		}
		provider.mu.Lock()
		refreshes, apiOK, refused, latest := provider.refreshes, provider.apiOK, provider.refused, provider.refresh
		provider.mu.Unlock()
		t.Logf("run %d: %d refreshes, %d API calls answered, refused %v", run, refreshes, apiOK, refused)
		if strings.Contains(logs, "real-") {
			t.Errorf("run %d: a real token was visible inside:\n%s", run, logs)
		}
		if strings.Count(logs, "api 200") < 10 || strings.Contains(logs, "api 401") || len(refused) > 0 {
			t.Errorf("run %d: the API calls did not all pass:\n%s", run, logs)
		}
		if !strings.Contains(logs, "hello, holder of agentconnect-placeholder-") {
			t.Errorf("run %d: the API's echo of the token is not the placeholder:\n%s", run, logs)
		}
		var store struct {
			Secrets []struct{ Name, Value string }
		}
		data, err := os.ReadFile(filepath.Join(home, "secrets", "secrets.json"))
		if err == nil {
			err = json.Unmarshal(data, &store)
		}
		stored := map[string]string{}
		for _, s := range store.Secrets {
			stored[s.Name] = s.Value
		}
		if err != nil || stored["claude-claude-refresh"] != latest {
			t.Errorf("run %d: the store holds refresh token %q, want the newest, %s (%v)", run, stored["claude-claude-refresh"], latest, err)
		}
		// Everything of the daemon's but the store: no token.
		for _, p := range filesHolding(t, home, []byte("real-")) {
			t.Errorf("run %d: %s holds a real token", run, p)
		}
	}
	check(1)
	provider.mu.Lock()
	first := provider.refreshes
	provider.mu.Unlock()
	if first < 3 {
		t.Errorf("%d refreshes in the first run, want at least 3", first)
	}
	// The next session starts from the renewed tokens in the store: the
	// provider has long revoked the first ones.
	check(2)
}
