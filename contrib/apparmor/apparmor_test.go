// Package apparmor holds the AppArmor profile that lets bubblewrap create
// user namespaces on hosts that restrict them (see README.md), and its tests.
package apparmor

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const profileFile = "bwrap"

// seedsDir is the documentation seeds, in shared/ beside the repository.
var seedsDir = filepath.Join("..", "..", "..", "shared", "seeds")

// seedProfile returns the profile text the seed gives between its
// `sudo tee /etc/apparmor.d/bwrap` line and EOF, and the seed's name.
func seedProfile(t *testing.T) (string, string) {
	t.Helper()
	entries, err := os.ReadDir(seedsDir)
	if err != nil {
		t.Skipf("no seeds directory beside the repository (%v): the profile is not compared with the docs", err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(seedsDir, e.Name()))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n")
		for i, l := range lines {
			if !strings.Contains(l, "sudo tee /etc/apparmor.d/bwrap") {
				continue
			}
			for j := i + 1; j < len(lines); j++ {
				if strings.TrimSpace(lines[j]) == "EOF" {
					return strings.Join(lines[i+1:j], "\n"), e.Name()
				}
			}
			t.Fatalf("%s: no EOF after the sudo tee /etc/apparmor.d/bwrap line", e.Name())
		}
	}
	t.Fatalf("no seed in %s gives the profile (a `sudo tee /etc/apparmor.d/bwrap` line up to EOF)", seedsDir)
	return "", ""
}

func TestProfileIsTheSeeds(t *testing.T) {
	want, seed := seedProfile(t)
	got, err := os.ReadFile(profileFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != strings.TrimSpace(want) {
		t.Errorf("contrib/apparmor/bwrap differs from the profile in seed %s:\n--- file\n%s\n--- seed\n%s", seed, got, want)
	}
}

// The profile text the README gives for installing without a checkout is
// the file's too.
func TestREADMEGivesTheProfile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	profile, err := os.ReadFile(profileFile)
	if err != nil {
		t.Fatal(err)
	}
	var indented []string
	for _, l := range strings.Split(strings.TrimSpace(string(profile)), "\n") {
		if l == "" {
			indented = append(indented, "")
		} else {
			indented = append(indented, "    "+l)
		}
	}
	if !strings.Contains(string(readme), strings.Join(indented, "\n")) {
		t.Errorf("README.md does not give the profile in contrib/apparmor/bwrap")
	}
	for _, s := range []string{
		"kernel.apparmor_restrict_unprivileged_userns=1",
		"sudo cp contrib/apparmor/bwrap /etc/apparmor.d/bwrap",
		"sudo apparmor_parser -r /etc/apparmor.d/bwrap",
		"bwrap --unshare-net --ro-bind / / true && echo ok",
		"bwrap-userns-restrict",
	} {
		if !strings.Contains(string(readme), s) {
			t.Errorf("README.md lacks %q", s)
		}
	}
}

// parser finds apparmor_parser and its version.
func parser(t *testing.T) (path string, major, minor int, version string) {
	t.Helper()
	path, err := exec.LookPath("apparmor_parser")
	if err != nil {
		for _, p := range []string{"/usr/sbin/apparmor_parser", "/sbin/apparmor_parser"} {
			if _, err := os.Stat(p); err == nil {
				path = p
				break
			}
		}
	}
	if path == "" {
		t.Skip("apparmor_parser is not installed (apt-get install apparmor): the profile is not parsed")
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	m := regexp.MustCompile(`version (\d+)\.(\d+)(\.\d+)?`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s --version: %v: %s", path, err, out)
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return path, major, minor, strings.TrimPrefix(m[0], "version ")
}

// parse runs apparmor_parser on file without loading it into the kernel
// (-Q) and without reading or writing its cache (-K).
func parse(path, file string) ([]byte, error) {
	return exec.Command(path, "-QK", file).CombinedOutput()
}

func TestProfileParses(t *testing.T) {
	path, major, _, version := parser(t)
	abs, err := filepath.Abs(profileFile)
	if err != nil {
		t.Fatal(err)
	}
	if major >= 4 {
		if out, err := parse(path, abs); err != nil {
			t.Fatalf("apparmor_parser %s -QK %s: %v\n%s", version, abs, err, out)
		}
		return
	}

	// An older parser: the profile is for AppArmor 4. Check that this
	// parser rejects it for the reasons given, then skip.
	out, err := parse(path, abs)
	if err == nil {
		t.Fatalf("apparmor_parser %s accepts the profile, which needs AppArmor 4:\n%s", version, out)
	}
	if !strings.Contains(string(out), "abi/4.0") {
		t.Errorf("apparmor_parser %s rejects the profile, but not for abi/4.0:\n%s", version, out)
	}
	noABI := filepath.Join(t.TempDir(), "bwrap")
	profile, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(noABI, []byte(strings.Replace(string(profile), "abi <abi/4.0>,\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out2, err := parse(path, noABI)
	if err == nil {
		t.Fatalf("apparmor_parser %s accepts `userns,` without the abi line:\n%s", version, out2)
	}
	if !strings.Contains(string(out2), "syntax error") {
		t.Errorf("apparmor_parser %s rejects the profile without its abi line, but not with a syntax error at userns:\n%s", version, out2)
	}
	t.Skipf("apparmor_parser %s (%s) is older than 4.0: Debian 12's 3.0.8 rejects `abi <abi/4.0>` and `userns,` "+
		"(here: %s / %s); the profile is for AppArmor 4 hosts (Ubuntu 23.10 and later), so it is parsed only where apparmor_parser is 4.0 or newer",
		version, path, lastLine(out), lastLine(out2))
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
