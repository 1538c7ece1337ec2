package supervisor

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/agentconnect-md/agentconnect/internal/home"
)

// listen creates the admin socket: 0600, or 0660 with config's socketGroup.
// The daemon holds the home lock, so a socket file already there is a
// leftover of a daemon that died.
func (s *Supervisor) listen() (net.Listener, error) {
	path := filepath.Join(s.socketDir, home.AdminSocketName)
	os.Remove(path)
	// The socket directory is private to the daemon user, so the umask's
	// mode before the chmod below lets nobody else in.
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// The socket file stays when the listener closes: a restart hands the
	// socket over, and a stop removes the file itself.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	mode := os.FileMode(0o600)
	if g := s.cfg.SocketGroup; g != "" {
		grp, err := user.LookupGroup(g)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("socketGroup %q: %w", g, err)
		}
		gid, _ := strconv.Atoi(grp.Gid)
		// The group must reach the socket: its directory and that
		// directory's parent (the home, or the short socket base) become
		// traversable by the group, not readable.
		for _, p := range []string{path, s.socketDir, filepath.Dir(s.socketDir)} {
			if err := os.Chown(p, -1, gid); err != nil {
				l.Close()
				return nil, fmt.Errorf("socketGroup %q: %w", g, err)
			}
			if p != path {
				os.Chmod(p, 0o710)
			}
		}
		mode = 0o660
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}
