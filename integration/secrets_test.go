package integration

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The value the tests store: searched for everywhere it must not be.
const secretValue = "sk-ant-test-VALUE-0f9e8d7c6b5a4321"

// valueHash is secretValue's sha256, which commands in a session look for.
var valueHash = func() string { h := sha256.Sum256([]byte(secretValue)); return hex.EncodeToString(h[:]) }()

// TestSecretsStore: set takes the value on stdin only and never shows it;
// ls names hosts and the agents bound; rm is refused while an agent is
// bound, unless --force; bad input changes nothing.
func TestSecretsStore(t *testing.T) {
	home := newHome(t)
	startDaemon(t, home)

	if r := run(t, home, secretValue+"\n", "secret", "set", "claude", "--preset", "anthropic", "--host", "gw.example.com:8443"); r.code != 0 || strings.Contains(r.stdout+r.stderr, secretValue) {
		t.Fatalf("secret set: %+v", r)
	}
	path := filepath.Join(home, "secrets", "secrets.json")
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the store: %v, %v; want mode 0600", err, fi)
	}
	for _, bad := range [][]string{
		{"secret", "set", "empty", "--host", "example.com"},               // no value on stdin
		{"secret", "set", "nohost"},                                       // no host
		{"secret", "set", "claude", "--preset", "nope"},                   // no such preset
		{"secret", "set", "claude", "--host", "example.com", secretValue}, // the value in argv
	} {
		stdin := ""
		if bad[2] != "empty" {
			stdin = "other-value"
		}
		before, _ := os.ReadFile(path)
		r := run(t, home, stdin, bad...)
		after, _ := os.ReadFile(path)
		if r.code == 0 || r.stderr == "" || !bytes.Equal(before, after) {
			t.Errorf("%v: exit %d, %q; want a refusal that changes nothing", bad, r.code, r.stderr)
		}
		t.Logf("%v: %s", bad[2:], strings.TrimSpace(r.stderr))
	}

	ok(t, home, "agent", "create", "bound", "--secret", "ANTHROPIC_API_KEY=claude", "--", "true")
	if r := run(t, home, "", "agent", "create", "unbound", "--secret", "KEY=missing", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "secret set missing") {
		t.Errorf("an agent bound to a missing secret: %+v", r)
	}
	if r := run(t, home, "", "agent", "create", "twice", "--env", "KEY=x", "--secret", "KEY=claude", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "both") {
		t.Errorf("a variable both plain and bound: %+v", r)
	}
	var secrets []struct {
		Name    string
		Hosts   []string
		Headers []string
		Agents  []string
		Value   *string `json:"value"`
	}
	okJSON(t, home, &secrets, "secret", "ls")
	if len(secrets) != 1 || secrets[0].Value != nil || strings.Join(secrets[0].Hosts, " ") != "api.anthropic.com gw.example.com:8443" ||
		strings.Join(secrets[0].Agents, " ") != "bound" || strings.Join(secrets[0].Headers, " ") != "authorization x-api-key" {
		t.Errorf("secret ls --json = %+v", secrets)
	}
	if out := ok(t, home, "agent", "show", "bound"); !strings.Contains(out, "ANTHROPIC_API_KEY from claude (the real value: host has no boundary)") {
		t.Errorf("agent show does not say what a host session gets:\n%s", out)
	}

	if r := run(t, home, "", "secret", "rm", "claude"); r.code == 0 || !strings.Contains(r.stderr, "bound to agent bound") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("secret rm while bound: %+v", r)
	}
	ok(t, home, "secret", "rm", "--force", "claude")
	if r := run(t, home, "", "session", "start", "bound"); r.code == 0 || !strings.Contains(r.stderr, "was removed") {
		t.Errorf("a session bound to a removed secret: %+v", r)
	}
	checkNoValue(t, home)
}

// TestSecretReachesOnlyWhatItMay: on host the runtime's variable holds the
// value; inside srt a placeholder, unique to the session. Neither the
// session's files nor the daemon's log or state hold the value.
func TestSecretReachesOnlyWhatItMay(t *testing.T) {
	requireBwrap(t)
	home := newHome(t)
	startDaemon(t, home)
	run(t, home, secretValue, "secret", "set", "claude", "--preset", "anthropic")
	// The runtimes print the variable's hash, so that the output log does
	// not hold the value either; a placeholder is printed as it is.
	ok(t, home, "agent", "create", "onhost", "--strategy", "host", "--secret", "ANTHROPIC_API_KEY=claude", "--",
		"sh", "-c", `printf %s "$ANTHROPIC_API_KEY" | sha256sum`)
	ok(t, home, "agent", "create", "insrt", "--strategy", "srt", "--secret", "ANTHROPIC_API_KEY=claude", "--",
		"sh", "-c", `printf %s "$ANTHROPIC_API_KEY"`)

	if out := ok(t, home, "exec", "--keep", "onhost"); !strings.HasPrefix(out, valueHash+" ") {
		t.Errorf("host: the runtime's ANTHROPIC_API_KEY hashes to %q, want the value's hash %s", out, valueHash)
	}
	first, second := ok(t, home, "exec", "--keep", "insrt"), ok(t, home, "exec", "--keep", "insrt")
	for _, got := range []string{first, second} {
		if !strings.HasPrefix(got, "agentconnect-placeholder-") || strings.Contains(got, secretValue) {
			t.Errorf("srt: the runtime's ANTHROPIC_API_KEY is %q, want a placeholder", got)
		}
	}
	if first == second {
		t.Errorf("two srt sessions got the same placeholder %q", first)
	}
	// An environment search from inside: nothing of the value anywhere
	// the sandbox's processes can read.
	// It looks for the value's hash among the hashes of every variable's
	// value, so that the command does not hold the value.
	ok(t, home, "agent", "create", "search", "--strategy", "srt", "--secret", "ANTHROPIC_API_KEY=claude", "--",
		"sh", "-c", `n=0; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < $f 2>/dev/null; done | while IFS= read -r kv; do
			printf %s "${kv#*=}" | sha256sum; done | grep -c `+valueHash+` || true`)
	if out := strings.TrimSpace(ok(t, home, "exec", "search")); out != "0" {
		t.Errorf("srt: the value is in %s environments of the sandbox's processes", out)
	}
	checkNoValue(t, home)
}

// checkNoValue fails if the value is in any file of the home but the
// store's own: session.json, the logs, agent.json, events.
func checkNoValue(t *testing.T, home string) {
	t.Helper()
	for _, p := range filesHolding(t, home, []byte(secretValue)) {
		t.Errorf("%s holds the secret's value", p)
	}
}

// filesHolding are the files under dir (but the secrets store) that hold
// needle. A VM's disks are sparse files of gigabytes: only their data is
// read, a piece at a time.
func filesHolding(t *testing.T, dir string, needle []byte) []string {
	t.Helper()
	var found []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || p == filepath.Join(dir, "secrets", "secrets.json") {
			return nil
		}
		if fileHolds(p, needle) {
			found = append(found, p)
		}
		return nil
	})
	return found
}

func fileHolds(path string, needle []byte) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	fd := int(f.Fd())
	buf := make([]byte, 1<<20)
	var off int64
	for {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			return false // ENXIO: no data after off
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return false
		}
		// Overlap the pieces by the needle's length, so that a value
		// across two of them is found.
		for pos := max(data-int64(len(needle)), 0); pos < hole; {
			n, _ := f.ReadAt(buf[:min(int64(len(buf)), hole-pos)], pos)
			if n <= 0 {
				break
			}
			if bytes.Contains(buf[:n], needle) {
				return true
			}
			if int64(n) <= int64(len(needle)) {
				break
			}
			pos += int64(n) - int64(len(needle))
		}
		off = hole
	}
}

// TestDaemonAndShimsAreNotDumpable: the processes that hold values write
// no core dump and let no other process of their user read their memory:
// the kernel gives a non-dumpable process's /proc/PID/environ (and mem,
// maps, ...) to root.
func TestDaemonAndShimsAreNotDumpable(t *testing.T) {
	requireRoot(t)
	home := nobodyHome(t)
	d := &daemon{t: t, home: home, cred: &syscall.Credential{Uid: nobody, Gid: nobody}}
	d.start()
	t.Cleanup(d.cleanup)
	ok(t, home, "agent", "create", "idle", "--", "sleep", "600")
	id := strings.TrimSpace(ok(t, home, "session", "start", "idle"))
	s := show(t, home, id)
	owner := func(pid int) uint32 {
		fi, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/environ")
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	if u := owner(d.pid()); u != 0 {
		t.Errorf("the daemon's /proc/PID/environ is uid %d's: it is dumpable", u)
	}
	if u := owner(s.ShimPID); u != 0 {
		t.Errorf("the shim's /proc/PID/environ is uid %d's: it is dumpable", u)
	}
	if u := owner(s.PID); u != nobody {
		t.Errorf("the runtime's /proc/PID/environ is uid %d's, want %d: the runtime is the user's own", u, nobody)
	}
}

// TestSRTProxyPutsTheValueOnTheWire: inside srt the runtime holds a
// placeholder; its request to the bound host arrives with the value (over
// TLS, intercepted with the session's CA, which the sandbox trusts), the
// host's echo of it comes back as the placeholder, and a host the secret
// is not bound to receives the placeholder as it is.
func TestSRTProxyPutsTheValueOnTheWire(t *testing.T) {
	requireBwrap(t)
	received := make(chan string, 4)
	newHost := func() (*httptest.Server, int) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			received <- r.Header.Get("X-Api-Key")
			fmt.Fprintf(w, "echo:%s", r.Header.Get("X-Api-Key"))
		}))
		t.Cleanup(srv.Close)
		return srv, srv.Listener.Addr().(*net.TCPAddr).Port
	}
	bound, boundPort := newHost()
	_, otherPort := newHost()
	home := newHome(t)
	caFile := filepath.Join(t.TempDir(), "gateway-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: bound.Certificate().Raw}), 0o644)
	writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"}`)
	startDaemon(t, home)
	run(t, home, secretValue, "secret", "set", "gw", "--host", fmt.Sprintf("127.0.0.1:%d", boundPort), "--header", "x-api-key")
	ok(t, home, "agent", "create", "client", "--strategy", "srt", "--secret", "KEY=gw",
		"--allow-domain", fmt.Sprintf("127.0.0.1:%d", boundPort), "--allow-domain", fmt.Sprintf("127.0.0.1:%d", otherPort), "--",
		"sh", "-c", fmt.Sprintf(`curl -sS --noproxy '' -H "X-Api-Key: $KEY" https://127.0.0.1:%d/; echo; curl -sSk --noproxy '' -H "X-Api-Key: $KEY" https://127.0.0.1:%d/`, boundPort, otherPort))
	r := run(t, home, "", "exec", "--keep", "client")
	if r.code != 0 {
		t.Fatalf("exec: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "echo:agentconnect-placeholder-") || lines[0] != lines[1] {
		t.Errorf("what the runtime saw: %q (want the placeholder echoed by both hosts)", lines)
	}
	if got := <-received; got != secretValue {
		t.Errorf("the bound host received %q, want the value", got)
	}
	if got := <-received; !strings.HasPrefix(got, "agentconnect-placeholder-") {
		t.Errorf("the host the secret is not bound to received %q, want the placeholder", got)
	}
	checkNoValue(t, home)
}

// TestSRTWithoutTheInjectorRefuses: a run with secrets whose injection
// cannot start is refused with the reason, never started without it, and
// leaves no process behind.
func TestSRTWithoutTheInjectorRefuses(t *testing.T) {
	requireBwrap(t)
	bin := t.TempDir()
	for _, f := range []string{"agentconnect", "agentconnect-shim"} {
		data, err := os.ReadFile(filepath.Join(binDir, f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(bin, f), data, 0o755)
	}
	home := newHome(t)
	d := &daemon{t: t, home: home, bin: filepath.Join(bin, "agentconnect")}
	d.start()
	t.Cleanup(d.cleanup)
	run(t, home, secretValue, "secret", "set", "k", "--host", "example.com")
	ok(t, home, "agent", "create", "bound", "--strategy", "srt", "--secret", "KEY=k", "--", "sleep", "612.34")
	r := run(t, home, "", "exec", "bound")
	if r.code != 125 || !strings.Contains(r.stderr, "agentconnect-inject") || !strings.Contains(r.stderr, "make install") {
		t.Errorf("exec without agentconnect-inject: %+v", r)
	}
	eventually(t, 10*time.Second, "no process of the session left", func() bool {
		return exec.Command("pgrep", "-f", "^sleep 612.34$").Run() != nil
	})
}

// TestSRTHidesCredentialFiles: the daemon user's credential files are
// absent inside srt even where a mount shows their directory, unless the
// agent opts one in by name; the rest of the mount is there.
func TestSRTHidesCredentialFiles(t *testing.T) {
	requireBwrap(t)
	fakeHome := t.TempDir()
	for p, data := range map[string]string{".ssh/id_test": "PRIVATE KEY", ".netrc": "machine x password y", ".config/gh/hosts.yml": "token", "notes.txt": "visible"} {
		os.MkdirAll(filepath.Dir(filepath.Join(fakeHome, p)), 0o700)
		os.WriteFile(filepath.Join(fakeHome, p), []byte(data), 0o600)
	}
	t.Setenv("HOME", fakeHome) // the daemon's user's home
	home := newHome(t)
	startDaemon(t, home)
	show := []string{"--", "sh", "-c", `for f in notes.txt .ssh/id_test .netrc .config/gh/hosts.yml; do printf '%s=' $f; cat /mnt/h/$f 2>/dev/null; echo; done`}
	ok(t, home, append([]string{"agent", "create", "hidden", "--strategy", "srt", "--mount", fakeHome + ":/mnt/h"}, show...)...)
	got := ok(t, home, "exec", "hidden")
	for _, want := range []string{"notes.txt=visible", ".ssh/id_test=\n", ".netrc=\n", ".config/gh/hosts.yml=\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("inside, with credentials hidden: want %q in\n%s", want, got)
		}
	}
	ok(t, home, append([]string{"agent", "create", "optin", "--strategy", "srt", "--mount", fakeHome + ":/mnt/h", "--allow-credential", "ssh"}, show...)...)
	got = ok(t, home, "exec", "optin")
	for _, want := range []string{".ssh/id_test=PRIVATE KEY", ".netrc=\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("inside, with ssh opted in: want %q in\n%s", want, got)
		}
	}
	if r := run(t, home, "", "agent", "create", "bad", "--allow-credential", "passwords", "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "known: aws") {
		t.Errorf("an unknown credential name: %+v", r)
	}
}

// TestGitOverHTTPSWithABoundToken: git clone and push inside srt against a
// loopback git server that wants a token in Basic credentials; the token
// in the sandbox is a placeholder, which the proxy swaps inside the Basic
// encoding on the way to the bound server only.
func TestGitOverHTTPSWithABoundToken(t *testing.T) {
	requireBwrap(t)
	backend := "/usr/lib/git-core/git-http-backend"
	if _, err := os.Stat(backend); err != nil {
		t.Skipf("no %s (git is not installed)", backend)
	}
	repos := t.TempDir()
	gitRun := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	gitRun(repos, "init", "-q", "--bare", "-b", "main", "project.git")
	gitRun(filepath.Join(repos, "project.git"), "config", "http.receivepack", "true")
	seed := t.TempDir()
	gitRun(seed, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(seed, "README"), []byte("seed\n"), 0o644)
	gitRun(seed, "add", "README")
	gitRun(seed, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "seed")
	gitRun(seed, "push", "-q", filepath.Join(repos, "project.git"), "main")

	var seenTokens []string
	var mu sync.Mutex
	cgiHandler := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + repos, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=agent"}}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pass, ok := r.BasicAuth()
		mu.Lock()
		seenTokens = append(seenTokens, pass)
		mu.Unlock()
		if !ok || pass != secretValue {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "token wanted", http.StatusUnauthorized)
			return
		}
		cgiHandler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	caFile := filepath.Join(t.TempDir(), "git-ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)

	home := newHome(t)
	writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"}`)
	startDaemon(t, home)
	run(t, home, secretValue, "secret", "set", "git-token", "--host", fmt.Sprintf("127.0.0.1:%d", port), "--header", "authorization")
	url := fmt.Sprintf("https://x-access-token:$TOKEN@127.0.0.1:%d/project.git", port)
	ok(t, home, "agent", "create", "gitter", "--strategy", "srt", "--secret", "TOKEN=git-token",
		"--allow-domain", fmt.Sprintf("127.0.0.1:%d", port), "--", "sh", "-c", `set -e
export NO_PROXY= no_proxy=
cd "$HOME"
git clone -q "`+url+`" project
cd project
echo change > CHANGE
git add CHANGE
git -c user.name=agent -c user.email=agent@example.com commit -q -m "from the sandbox"
git push -q origin main
echo pushed`)
	r := run(t, home, "", "exec", "gitter")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "pushed" {
		t.Fatalf("git inside srt: %+v", r)
	}
	out, err := exec.Command("git", "--git-dir", filepath.Join(repos, "project.git"), "log", "--format=%s", "-1", "main").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "from the sandbox" {
		t.Errorf("the server's main: %q %v", out, err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, tok := range seenTokens {
		if tok != "" && tok != secretValue {
			t.Errorf("the server was sent %q as the token: want the value (or none, for git's first try)", tok)
		}
	}
	checkNoValue(t, home)
}

// TestSRTInjectionRefusals: from inside srt, a bound host whose certificate
// does not verify gets no request and the client reads why; a request whose
// Host is not the tunnel's target is refused (421).
func TestSRTInjectionRefusals(t *testing.T) {
	requireBwrap(t)
	reached := make(chan string, 4)
	newHost := func() (*httptest.Server, int) {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- r.Host }))
		t.Cleanup(srv.Close)
		return srv, srv.Listener.Addr().(*net.TCPAddr).Port
	}
	trusted, trustedPort := newHost()
	// httptest's servers share one certificate: this one gets its own,
	// which nobody trusts.
	untrusted := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached <- r.Host }))
	untrusted.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}
	untrusted.StartTLS()
	t.Cleanup(untrusted.Close)
	untrustedPort := untrusted.Listener.Addr().(*net.TCPAddr).Port
	home := newHome(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: trusted.Certificate().Raw}), 0o644)
	writeConfig(t, home, `{"trustedCAFile": "`+caFile+`"}`)
	startDaemon(t, home)
	run(t, home, secretValue, "secret", "set", "k", "--host", fmt.Sprintf("127.0.0.1:%d", trustedPort), "--host", fmt.Sprintf("127.0.0.1:%d", untrustedPort))
	ok(t, home, "agent", "create", "c", "--strategy", "srt", "--secret", "KEY=k",
		"--allow-domain", fmt.Sprintf("127.0.0.1:%d", trustedPort), "--allow-domain", fmt.Sprintf("127.0.0.1:%d", untrustedPort), "--",
		"sh", "-c", fmt.Sprintf(`curl -s --noproxy '' -w ' %%{http_code}\n' -H "X-Api-Key: $KEY" https://127.0.0.1:%d/
curl -s --noproxy '' -o /dev/null -w '%%{http_code}\n' -H "Host: api.example.com" -H "X-Api-Key: $KEY" https://127.0.0.1:%d/`, untrustedPort, trustedPort))
	r := run(t, home, "", "exec", "c")
	// The refusal's body (a line), its code, then the second request's.
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "did not prove who it is") || lines[1] != " 502" || lines[2] != "421" {
		t.Errorf("inside: %q (want the untrusted host's 502 with the reason, then 421)\n%s", lines, r.stderr)
	}
	select {
	case h := <-reached:
		t.Errorf("a request reached a host (%s) it should not have", h)
	default:
	}
	checkNoValue(t, home)
}

// selfSigned is a certificate for 127.0.0.1 that no CA vouches for.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "untrusted"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestSecretStaysOutOfAVM: inside a microsandbox VM the bound variable
// holds a placeholder; no process's environment and no file the guest can
// write (its /etc, /run, /tmp, /root, /home, /var and the shares) holds
// the value; the guest trusts the session CA through its system bundle and
// the trust variables; and none of the VM's disks on the host holds it.
// The same in a warm VM, booted and set up before the session and its
// secret came (its CA is trusted at the claim).
func TestSecretStaysOutOfAVM(t *testing.T) {
	requireMicrosandbox(t)
	for _, warm := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(t *testing.T) { secretStaysOutOfAVM(t, warm) })
	}
}

func secretStaysOutOfAVM(t *testing.T, warm bool) {
	h, _ := startVMDaemon(t, "")
	run(t, h, secretValue, "secret", "set", "claude", "--preset", "anthropic")
	half := len(secretValue) / 2
	// The value is put together inside from two halves, so that neither
	// the command nor session.json holds it.
	script := fmt.Sprintf(`printf 'key %%s\n' "$ANTHROPIC_API_KEY"
n=$(for f in /proc/[0-9]*/environ; do tr '\0' '\n' < $f 2>/dev/null; done | while IFS= read -r kv; do printf %%s "${kv#*=}" | sha256sum; done | grep -c %s || true)
echo "environ $n"
v="$(printf %%s %s)$(printf %%s %s)"
echo "assembled $(printf %%s "$v" | sha256sum | cut -c1-64)"
echo "files $(grep -rlsF -e "$v" /etc /run /tmp /root /home /var "$PWD" "$HOME" 2>/dev/null | wc -l)"
echo "bundle $(grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt) $(grep -c 'BEGIN CERTIFICATE' /run/agentconnect/ca-bundle.pem)"
echo "trust $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS"
`, valueHash, secretValue[:half], secretValue[half:])
	args := []string{"agent", "create", "vm", "--strategy", "microsandbox", "--secret", "ANTHROPIC_API_KEY=claude"}
	if warm {
		args = append(args, "--warm", "1")
	}
	ok(t, h, append(args, "--", "sh", "-c", script)...)
	var ready map[string]int
	if warm {
		ready = waitWarmAgent(t, h, "vm", 1)
	}
	id, out := startAndWait(t, h, "vm", "")
	t.Logf("guest:\n%s", out)
	if _, claimed := ready[id]; warm && (!claimed || !strings.Contains(shimLog(h, id), "warm boundary claimed")) {
		t.Errorf("session %s did not claim the warm VM %v; shim log:\n%s", id, ready, shimLog(h, id))
	}
	for _, want := range []string{"key agentconnect-placeholder-", "environ 0\n", "assembled " + valueHash + "\n", "files 0\n",
		"trust /run/agentconnect/ca-bundle.pem /run/agentconnect/ca-bundle.pem"} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest's output lacks %q", want)
		}
	}
	var sys, bundle int
	if _, err := fmt.Sscanf(out[strings.Index(out, "bundle "):], "bundle %d %d", &sys, &bundle); err != nil || sys != bundle || sys < 2 {
		t.Errorf("the system bundle holds %d certificates and the session's %d, want the same (the system's and the session CA): %v", sys, bundle, err)
	}
	checkNoValue(t, h)
}
