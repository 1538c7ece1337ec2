package home

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	userHome, _ := os.UserHomeDir()
	for _, tc := range []struct {
		name, flag, instance, env, want, wantErr string
	}{
		{name: "flag wins", flag: "/srv/ac", env: "/env", want: "/srv/ac"},
		{name: "env", env: "/env/ac", want: "/env/ac"},
		{name: "default", want: filepath.Join(userHome, ".agentconnect")},
		{name: "instance", instance: "work", env: "/env/ignored", want: filepath.Join(userHome, ".agentconnect", "instances", "work")},
		{name: "both", flag: "/a", instance: "b", wantErr: "not both"},
		{name: "bad instance", instance: "../x", wantErr: "instance name"},
		{name: "relative", flag: "rel", want: filepath.Join(mustWd(t), "rel")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(EnvHome, tc.env)
			got, err := Resolve(tc.flag, tc.instance)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve = %q, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Resolve = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func mustWd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}

func TestSocketDirShortHome(t *testing.T) {
	l := Layout{Root: t.TempDir()}
	if err := l.Create(); err != nil {
		t.Fatal(err)
	}
	dir, err := l.SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	if dir != l.RunDir() || l.FindSocketDir() != dir {
		t.Errorf("SocketDir = %q, FindSocketDir = %q; want %q", dir, l.FindSocketDir(), l.RunDir())
	}
}

func TestSocketDirLongHome(t *testing.T) {
	root := filepath.Join(t.TempDir(), strings.Repeat("d", 90))
	l := Layout{Root: root}
	if err := l.Create(); err != nil {
		t.Fatal(err)
	}
	dir, err := l.SocketDir()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if strings.HasPrefix(dir, root) {
		t.Fatalf("SocketDir = %q, inside the long home", dir)
	}
	if got := l.FindSocketDir(); got != dir {
		t.Errorf("FindSocketDir = %q, want %q (the pointer file)", got, dir)
	}
	if p := l.AdminSocket(); len(p) > maxSocketPath {
		t.Errorf("admin socket path is %d bytes, over the limit", len(p))
	}
	if p := ShimSocket(dir, "0123456789abcdef", 3); len(p) > maxSocketPath {
		t.Errorf("shim socket path is %d bytes, over the limit", len(p))
	}
}

func TestLockOnePerHome(t *testing.T) {
	l := Layout{Root: t.TempDir()}
	l.Create()
	f, err := l.Lock()
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Lock()
	var locked *ErrLocked
	if !errors.As(err, &locked) {
		t.Fatalf("second Lock = %v, want ErrLocked", err)
	}
	if locked.PID != os.Getpid() {
		t.Errorf("holder pid = %d, want %d", locked.PID, os.Getpid())
	}
	if !strings.Contains(err.Error(), "already running") {
		t.Errorf("message %q does not say a daemon is already running", err)
	}
	f.Close()
	f, err = l.Lock()
	if err != nil {
		t.Fatalf("Lock after release = %v", err)
	}
	f.Close()
}

func TestShimSocketDiffersPerRun(t *testing.T) {
	if ShimSocket("/r", "abc", 1) == ShimSocket("/r", "abc", 2) {
		t.Error("two runs of one session share a socket path")
	}
}

func TestRecordAdminSocket(t *testing.T) {
	l := Layout{Root: t.TempDir()}
	l.Create()
	def := l.AdminSocket()
	if err := l.RecordAdminSocket("/run/agentconnect/agentconnect.sock"); err != nil {
		t.Fatal(err)
	}
	if got := l.AdminSocket(); got != "/run/agentconnect/agentconnect.sock" {
		t.Errorf("AdminSocket = %q after recording an activated socket", got)
	}
	if err := l.RecordAdminSocket(def); err != nil {
		t.Fatal(err)
	}
	if got := l.AdminSocket(); got != def {
		t.Errorf("AdminSocket = %q, want the default %q again", got, def)
	}
}
