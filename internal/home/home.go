// Package home lays out a daemon's home directory: where its config, agents,
// sessions, sockets and lock live.
package home

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// EnvHome names the environment variable that sets the home, as --home does.
const EnvHome = "AGENTCONNECT_HOME"

// AdminSocketName is the admin socket's file name in the socket directory.
const AdminSocketName = "agentconnect.sock"

// maxSocketPath is the longest path a unix socket can bind to: sun_path is
// 108 bytes including the terminating NUL.
const maxSocketPath = 107

// longestSocketName is the longest file name this package puts in a socket
// directory: the admin socket or a shim's "<16 hex>.sock".
const longestSocketName = len(AdminSocketName)

// Compiled when first used, not at every CLI start.
var instanceName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`) })

// Resolve picks the home: --home, then $AGENTCONNECT_HOME, then --instance
// (~/.agentconnect/instances/NAME), then ~/.agentconnect. The result is
// absolute and clean; it need not exist yet.
func Resolve(flagHome, instance string) (string, error) {
	if flagHome != "" && instance != "" {
		return "", errors.New("use --home or --instance, not both")
	}
	if instance != "" && !instanceName().MatchString(instance) {
		return "", fmt.Errorf("instance name %q: use letters, digits, '.', '_' and '-' (at most 63), starting with a letter or digit", instance)
	}
	dir := flagHome
	if dir == "" && instance == "" {
		dir = os.Getenv(EnvHome)
	}
	if dir == "" {
		userHome, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("find the home directory: %w (set --home or %s)", err, EnvHome)
		}
		dir = filepath.Join(userHome, ".agentconnect")
		if instance != "" {
			dir = filepath.Join(dir, "instances", instance)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("home %s: %w", dir, err)
	}
	return abs, nil
}

// Layout names the files of one home.
type Layout struct {
	Root string
}

func (l Layout) ConfigPath() string     { return filepath.Join(l.Root, "config.json") }
func (l Layout) AgentsDir() string      { return filepath.Join(l.Root, "agents") }
func (l Layout) SessionsDir() string    { return filepath.Join(l.Root, "sessions") }
func (l Layout) VMsDir() string         { return filepath.Join(l.Root, "vms") }
func (l Layout) VMSnapshotsDir() string { return filepath.Join(l.Root, "vm-snapshots") }
func (l Layout) ImagesDir() string      { return filepath.Join(l.Root, "images") }
func (l Layout) SecretsPath() string    { return filepath.Join(l.Root, "secrets", "secrets.json") }
func (l Layout) RuntimesDir() string    { return filepath.Join(l.Root, "runtimes") }
func (l Layout) RunDir() string         { return filepath.Join(l.Root, "run") }
func (l Layout) LockPath() string       { return filepath.Join(l.Root, "run", "daemon.lock") }
func (l Layout) AgentDir(id string) string {
	return filepath.Join(l.Root, "agents", id)
}
func (l Layout) SessionDir(id string) string {
	return filepath.Join(l.Root, "sessions", id)
}

// StartupFailurePath is where a daemon that failed to start leaves the reason,
// for `status` to show when no daemon answers.
func (l Layout) StartupFailurePath() string {
	return filepath.Join(l.Root, "run", "startup-failure.txt")
}

// socketDirPointer is the file that names the socket directory when it is not
// <home>/run.
func (l Layout) socketDirPointer() string { return filepath.Join(l.Root, "run", "socket-dir") }

// Create makes the home's directories, private to the daemon user.
func (l Layout) Create() error {
	for _, d := range []string{l.Root, l.AgentsDir(), l.SessionsDir(), l.VMsDir(), l.ImagesDir(), l.RunDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("create home: %w", err)
		}
	}
	// The home may have been made by hand with a looser mode: the sessions,
	// sockets and agent secrets in it are for the daemon user alone (a
	// socketGroup may traverse it to reach the admin socket, and others
	// to their own directories, sandbox.host.user's runtimes).
	fi, err := os.Stat(l.Root)
	if err != nil {
		return fmt.Errorf("create home: %w", err)
	}
	if fi.Mode().Perm()&0o026 != 0 {
		if err := os.Chmod(l.Root, 0o700); err != nil {
			return fmt.Errorf("create home: %w", err)
		}
	}
	return nil
}

// SocketDir returns the directory for the home's sockets. It is <home>/run
// when socket paths there fit the unix limit; otherwise a short private
// directory named by a hash of the home, recorded in <home>/run/socket-dir so
// that clients find it. It creates the directory.
func (l Layout) SocketDir() (string, error) {
	runDir := l.RunDir()
	if len(runDir)+1+longestSocketName <= maxSocketPath {
		os.Remove(l.socketDirPointer())
		return runDir, nil
	}
	dir := filepath.Join(shortBase(), hashName(l.Root, 12))
	if len(dir)+1+longestSocketName > maxSocketPath {
		return "", fmt.Errorf("home %s: its socket paths are too long for a unix socket and no short runtime directory is usable (%s); use a shorter --home", l.Root, dir)
	}
	if err := privateDir(dir); err != nil {
		return "", err
	}
	if err := os.WriteFile(l.socketDirPointer(), []byte(dir+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("record socket directory: %w", err)
	}
	return dir, nil
}

// FindSocketDir returns the socket directory a daemon on this home uses,
// without creating anything: what a client needs.
func (l Layout) FindSocketDir() string {
	if data, err := os.ReadFile(l.socketDirPointer()); err == nil {
		if dir := strings.TrimSpace(string(data)); dir != "" {
			return dir
		}
	}
	return l.RunDir()
}

// adminSocketPointer names the admin socket when it is not in the socket
// directory: systemd socket activation put it elsewhere.
func (l Layout) adminSocketPointer() string { return filepath.Join(l.Root, "run", "admin-socket") }

// AdminSocket is the admin socket's path, as a client finds it.
func (l Layout) AdminSocket() string {
	if data, err := os.ReadFile(l.adminSocketPointer()); err == nil {
		if p := strings.TrimSpace(string(data)); p != "" {
			return p
		}
	}
	return filepath.Join(l.FindSocketDir(), AdminSocketName)
}

// RecordAdminSocket notes where a daemon's admin socket is, so that --home
// alone finds it; an empty path, or the usual place, removes the note.
func (l Layout) RecordAdminSocket(path string) error {
	if path == "" || path == filepath.Join(l.FindSocketDir(), AdminSocketName) {
		err := os.Remove(l.adminSocketPointer())
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.WriteFile(l.adminSocketPointer(), []byte(path+"\n"), 0o600)
}

// RunDirFor returns a directory for a VM's sockets, named by a hash of key:
// in the socket directory when the socket paths fit the unix limit there,
// else in the short private base. It does not create it.
func (l Layout) RunDirFor(key string) (string, error) {
	const longestVMSocket = len("agent.sock") + 2
	name := hashName(key, 16) + ".vm"
	dir := filepath.Join(l.FindSocketDir(), name)
	if len(dir)+1+longestVMSocket <= maxSocketPath {
		return dir, nil
	}
	base := filepath.Join(shortBase(), hashName(l.Root, 12))
	if err := privateDir(base); err != nil {
		return "", err
	}
	dir = filepath.Join(base, name)
	if len(dir)+1+longestVMSocket > maxSocketPath {
		return "", fmt.Errorf("home %s: no socket directory short enough for a VM's sockets; use a shorter --home", l.Root)
	}
	return dir, nil
}

// ShimSocket is the socket path of one run of a session's shim, in dir.
func ShimSocket(dir, sessionID string, run uint32) string {
	return filepath.Join(dir, hashName(sessionID+"/"+strconv.FormatUint(uint64(run), 10), 16)+".sock")
}

// CgroupName is the daemon's parent cgroup, below the daemon's own cgroup
// in each hierarchy: the home's name in the tree every daemon on the
// machine shares. Its session cgroups are
// made inside it; the daemon removes it when it stops with none left.
func (l Layout) CgroupName() string {
	return filepath.Join("agentconnect", hashName(l.Root, 12))
}

func hashName(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:n]
}

// shortBase is a short, per-user directory for sockets.
func shortBase() string {
	if os.Geteuid() == 0 {
		return "/run/agentconnect"
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && len(x) < 64 {
		return filepath.Join(x, "agentconnect")
	}
	return filepath.Join(os.TempDir(), "agentconnect-"+strconv.Itoa(os.Geteuid()))
}

// privateDir creates dir (and a missing parent) and checks both: in a
// shared place such as /tmp another user could have made them first. Each
// must be a real directory owned by this user that no one else can write
// to; dir itself, where the sockets are, also no one else can list (a
// socketGroup may traverse it). The parent may be readable, as systemd makes
// /run/agentconnect for its socket units.
func privateDir(dir string) error {
	for _, d := range []struct {
		path      string
		forbidden os.FileMode
	}{{filepath.Dir(dir), 0o022}, {dir, 0o027}} {
		if err := os.Mkdir(d.path, 0o700); err != nil && !os.IsExist(err) {
			return fmt.Errorf("create socket directory: %w", err)
		}
		fi, err := os.Lstat(d.path)
		if err != nil {
			return fmt.Errorf("create socket directory: %w", err)
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || st == nil || (int(st.Uid) != os.Geteuid() && st.Uid != 0) || fi.Mode().Perm()&d.forbidden != 0 {
			return fmt.Errorf("socket directory %s is not a private directory of this user (remove it and try again)", d.path)
		}
	}
	return nil
}
