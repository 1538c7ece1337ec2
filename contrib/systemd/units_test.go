// Package systemd checks the unit files beside it: that systemd accepts
// them (systemd-analyze verify) and that they say what the design requires.
package systemd

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unitSet is a socket and the service it activates.
type unitSet struct {
	name string
	dir  string // where the files are, relative to this directory
	// socket and service are the shipped file names; instance, when set,
	// names the instance of a template to verify.
	socket, service string
	instance        string
	user            bool   // user units: systemd-analyze --user
	execStart       string // the shipped ExecStart= program
}

var unitSets = []unitSet{
	{name: "system", dir: ".", socket: "agentconnect.socket", service: "agentconnect.service",
		execStart: "/usr/local/bin/agentconnect"},
	{name: "instance", dir: ".", socket: "agentconnect@.socket", service: "agentconnect@.service",
		instance: "work", execStart: "/usr/local/bin/agentconnect"},
	{name: "user", dir: "user", socket: "agentconnect.socket", service: "agentconnect.service",
		user: true, execStart: "%h/.local/bin/agentconnect"},
}

// TestVerify renders each set with ExecStart= pointing at a real agentconnect
// binary (verify checks that the program exists and is executable) and runs
// systemd-analyze verify on the socket and the service together, since each
// names the other.
//
// What systemd-analyze 252 prints decides how the result is read:
//   - It resolves neither User= and Group= nor SupplementaryGroups= and
//     SocketGroup= (they are looked up when the unit starts), so the missing
//     user agentconnect and group kvm on a build machine produce no message:
//     the units are verified as shipped, and TestDirectives pins the names.
//   - A wrong value or an unknown key ("Failed to parse kill mode
//     specification, ignoring", "Unknown key 'Delegat' in section
//     [Service], ignoring") is a warning that leaves the exit status 0
//     when --recursive-errors is not given (with it, 1). So any message
//     about these units fails the test, whatever the status.
//   - --recursive-errors=one limits the exit status to the units named and
//     their immediate dependencies: a Requires= on a missing unit fails, a
//     problem deep in the host's own units does not (its messages are
//     logged).
//   - --user needs XDG_RUNTIME_DIR ("Failed to lookup RuntimeDirectory path")
//     to expand %t; a machine without a user session has none, so the test
//     gives it a private one.
func TestVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd); the units are not verified")
	}
	bin := agentconnectBinary(t)
	for _, set := range unitSets {
		t.Run(set.name, func(t *testing.T) {
			dir := t.TempDir()
			socket := render(t, set, set.socket, dir, bin)
			service := render(t, set, set.service, dir, bin)
			if set.instance != "" {
				socket = instantiate(t, socket, set.instance)
				service = instantiate(t, service, set.instance)
			}
			args := []string{"verify", "--recursive-errors=one", socket, service}
			if set.user {
				args = append([]string{"--user"}, args...)
			}
			cmd := exec.Command(analyze, args...)
			cmd.Env = append(os.Environ(), "SYSTEMD_LOG_COLOR=0")
			if set.user {
				cmd.Env = append(cmd.Env, "XDG_RUNTIME_DIR="+t.TempDir())
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("systemd-analyze %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			ours := []string{dir, unitName(socket), unitName(service)}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if line == "" {
					continue
				}
				if mentionsAny(line, ours) {
					t.Errorf("systemd-analyze about %s: %s", set.name, line)
				} else {
					t.Logf("systemd-analyze, not about these units: %s", line)
				}
			}
		})
	}
}

// agentconnectBinary is $AGENTCONNECT_BIN/agentconnect, or a fresh build.
func agentconnectBinary(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("AGENTCONNECT_BIN"); dir != "" {
		bin, err := filepath.Abs(filepath.Join(dir, "agentconnect"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("AGENTCONNECT_BIN: %v", err)
		}
		return bin
	}
	bin := filepath.Join(t.TempDir(), "agentconnect")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/agentconnect-md/agentconnect/cmd/agentconnect")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agentconnect: %v\n%s", err, out)
	}
	return bin
}

// render copies a shipped unit into dir with its ExecStart= program
// replaced by bin, and returns the copy's path.
func render(t *testing.T, set unitSet, name, dir, bin string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(set.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(name, ".service") {
		from := "\nExecStart=" + set.execStart + " "
		if n := bytes.Count(data, []byte(from)); n != 1 {
			t.Fatalf("%s: %d lines start with %q, want 1", name, n, strings.TrimSpace(from))
		}
		data = bytes.Replace(data, []byte(from), []byte("\nExecStart="+bin+" "), 1)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// instantiate links the instance name of a template, as systemctl enable
// does, and returns the link's path.
func instantiate(t *testing.T, template, instance string) string {
	t.Helper()
	base := filepath.Base(template)
	at := strings.Index(base, "@.")
	if at < 0 {
		t.Fatalf("%s is not a template", base)
	}
	link := filepath.Join(filepath.Dir(template), base[:at+1]+instance+base[at+1:])
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	return link
}

func unitName(path string) string { return filepath.Base(path) }

func mentionsAny(line string, words []string) bool {
	for _, w := range words {
		if strings.Contains(line, w) {
			return true
		}
	}
	return false
}

// A directive the design requires of a shipped unit.
type directive struct {
	file, section, key, want string
}

// TestDirectives checks the shipped units for what the design requires. It
// reads the files as systemd does for these keys: the last assignment of a
// single-valued key wins; list keys accumulate.
func TestDirectives(t *testing.T) {
	var want []directive
	services := map[string]string{
		"agentconnect.service":      "agentconnect.socket",
		"agentconnect@.service":     "agentconnect@%i.socket",
		"user/agentconnect.service": "agentconnect.socket",
	}
	for service, socket := range services {
		want = append(want,
			directive{service, "Service", "Type", "notify"},
			directive{service, "Service", "KillMode", "process"},
			directive{service, "Service", "Delegate", "yes"},
			directive{service, "Service", "Restart", "always"},
			// SIGHUP to the supervisor only: a re-exec that keeps the sessions.
			directive{service, "Service", "ExecReload", "/bin/kill -HUP $MAINPID"},
			directive{service, "Unit", "Requires", socket},
			directive{service, "Unit", "After", socket},
		)
	}
	for _, service := range []string{"agentconnect.service", "agentconnect@.service"} {
		want = append(want,
			directive{service, "Service", "User", "agentconnect"},
			directive{service, "Service", "Group", "agentconnect"},
			directive{service, "Service", "SupplementaryGroups", "kvm"},
			directive{service, "Service", "StateDirectory", "agentconnect"},
			directive{service, "Install", "WantedBy", "multi-user.target"},
		)
	}
	for _, socket := range []string{"agentconnect.socket", "agentconnect@.socket"} {
		want = append(want,
			directive{socket, "Socket", "SocketMode", "0660"},
			directive{socket, "Socket", "SocketGroup", "agentconnect"},
		)
	}
	want = append(want,
		directive{"agentconnect.service", "Service", "ExecStart", "/usr/local/bin/agentconnect run"},
		directive{"agentconnect.service", "Service", "Environment", "AGENTCONNECT_HOME=/var/lib/agentconnect"},
		directive{"agentconnect.socket", "Socket", "ListenStream", "/run/agentconnect/agentconnect.sock"},
		directive{"agentconnect@.service", "Service", "ExecStart", "/usr/local/bin/agentconnect --instance %i run"},
		// --instance goes by HOME, so this is what puts the instance's home in
		// /var/lib/agentconnect/.agentconnect/instances/%i.
		directive{"agentconnect@.service", "Service", "Environment", "HOME=/var/lib/agentconnect"},
		directive{"agentconnect@.socket", "Socket", "ListenStream", "/run/agentconnect/%i.sock"},
		directive{"user/agentconnect.service", "Service", "ExecStart", "%h/.local/bin/agentconnect run"},
		directive{"user/agentconnect.service", "Service", "Environment", "AGENTCONNECT_HOME=%h/.agentconnect"},
		directive{"user/agentconnect.service", "Install", "WantedBy", "default.target"},
		directive{"user/agentconnect.socket", "Socket", "ListenStream", "%t/agentconnect/agentconnect.sock"},
	)

	units := map[string]map[string][]string{}
	for _, d := range want {
		u, ok := units[d.file]
		if !ok {
			u = parseUnit(t, d.file)
			units[d.file] = u
		}
		values := u[d.section+"."+d.key]
		if listKeys[d.key] {
			if !containsField(values, d.want) {
				t.Errorf("%s: [%s] %s = %q, want it to include %q", d.file, d.section, d.key, values, d.want)
			}
			continue
		}
		if len(values) == 0 || values[len(values)-1] != d.want {
			t.Errorf("%s: [%s] %s = %q, want %q", d.file, d.section, d.key, values, d.want)
		}
	}

	// The supervisor is favoured by the OOM killer, but not shielded:
	// its shims and runtimes inherit the value.
	for _, service := range []string{"agentconnect.service", "agentconnect@.service"} {
		v := units[service]["Service.OOMScoreAdjust"]
		if len(v) == 0 || !strings.HasPrefix(v[len(v)-1], "-") || v[len(v)-1] == "-1000" {
			t.Errorf("%s: OOMScoreAdjust = %q, want a negative value above -1000", service, v)
		}
	}
}

// listKeys accumulate their assignments; each value is a list of words
// (Environment's quoting is not needed for these units).
var listKeys = map[string]bool{
	"Requires": true, "After": true, "Wants": true, "WantedBy": true,
	"SupplementaryGroups": true, "StateDirectory": true, "Environment": true, "ListenStream": true,
}

func containsField(values []string, want string) bool {
	for _, v := range values {
		for _, f := range strings.Fields(v) {
			if f == want {
				return true
			}
		}
	}
	return false
}

// parseUnit reads a unit file into "Section.Key" → its assignments, in order.
func parseUnit(t *testing.T, name string) map[string][]string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
		default:
			key, value, ok := strings.Cut(line, "=")
			if !ok || section == "" || strings.HasSuffix(line, "\\") {
				t.Fatalf("%s:%d: not a plain assignment: %s", name, n, line)
			}
			u[section+"."+strings.TrimSpace(key)] = append(u[section+"."+strings.TrimSpace(key)], strings.TrimSpace(value))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}
