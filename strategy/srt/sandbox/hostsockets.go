package sandbox

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/strategy/srt/hostsock"
)

// view says where the sandbox shows host paths: the top-level directories
// bound read-only at their own paths, minus the hidden ones, and the
// directories bound elsewhere (the agent's, the mounts).
type view struct {
	tops    []string // host paths shown at the same path
	hidden  []string // host paths below tops covered by an empty tmpfs
	binds   []bind   // host source → target inside
	covered []string // places inside covered (the credential files a bind shows)
}

type bind struct{ source, target string }

// inside lists where host path p appears in the view: once through the
// system's read-only view unless hidden, and once per bind that holds it.
func (v *view) inside(p string) []string {
	var out []string
	for _, b := range v.binds {
		if within(b.source, p) {
			rel, _ := filepath.Rel(b.source, p)
			out = append(out, filepath.Join(b.target, rel))
		}
	}
	shown := false
	for _, t := range v.tops {
		shown = shown || within(t, p)
	}
	for _, h := range v.hidden {
		shown = shown && !within(h, p)
	}
	if shown {
		out = append(out, p)
	}
	kept := out[:0]
	for _, in := range out {
		gone := false
		for _, c := range v.covered {
			gone = gone || within(c, in)
		}
		if !gone {
			kept = append(kept, in)
		}
	}
	return kept
}

// hostSockets finds where the view would show a socket bound on the host
// (hostsock.BoundEverywhere), by each socket's name, and by a walk of what
// the view shows when a socket's name does not lead to it (bound with a
// relative name, or in another mount namespace) and its device is one the
// view shows. A walk reads every directory the view shows (600 ms here), so
// what it found, or that it found nothing, is kept in cache (a file the
// next starts read) for as long as the socket stays bound. It returns the
// places inside to cover.
func (v *view) hostSockets(cache string) ([]string, error) {
	socks, err := hostsock.BoundEverywhere()
	if err != nil {
		return nil, fmt.Errorf("find the host's unix sockets, which the sandbox must not reach: %w", err)
	}
	var places []string
	lost := map[string]hostsock.Socket{}
	for _, s := range socks {
		if p, ok := located(s); ok {
			places = append(places, v.inside(p)...)
		} else if s.Ino != 0 {
			lost[socketKey(s)] = s
		}
	}
	if len(lost) == 0 {
		return places, nil
	}
	known := readWalkCache(cache)
	found := map[string]string{} // key → host path, "" for nowhere the view shows
	search := map[[2]uint64]string{}
	devs, err := v.devices()
	if err != nil {
		return nil, err
	}
	for k, s := range lost {
		if p, ok := known[k]; ok && (p == "" || hasIdentity(p, s)) {
			found[k] = p
			continue
		}
		if !devs[s.Dev] {
			found[k] = "" // on a file system the view does not show
			continue
		}
		search[[2]uint64{s.Dev, s.Ino}] = k
	}
	if len(search) > 0 {
		// The slow way: every directory the view shows, for socket
		// entries with those identities.
		for k := range search {
			found[search[k]] = ""
		}
		for _, r := range append(append([]string{}, v.tops...), v.sources()...) {
			err := filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return nil // unreadable here: unreadable for the sandbox too
				}
				if d.IsDir() && len(v.inside(p)) == 0 && !v.holdsBind(p) {
					return filepath.SkipDir
				}
				if d.Type()&fs.ModeSocket == 0 {
					return nil
				}
				var st unix.Stat_t
				if unix.Lstat(p, &st) == nil {
					if k, ok := search[[2]uint64{st.Dev, st.Ino}]; ok {
						found[k] = p
					}
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
		writeWalkCache(cache, found)
	}
	for _, p := range found {
		if p != "" {
			places = append(places, v.inside(p)...)
		}
	}
	return places, nil
}

// socketKey names a bound socket for the walk's cache: its own inode and
// its file's, which a later socket does not share.
func socketKey(s hostsock.Socket) string {
	return fmt.Sprintf("%d:%d:%d", s.SockIno, s.Dev, s.Ino)
}

// hasIdentity reports whether p is still the socket file of s.
func hasIdentity(p string, s hostsock.Socket) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK && st.Dev == s.Dev && st.Ino == s.Ino
}

// readWalkCache reads what earlier walks found; a missing or unreadable
// cache is empty (the walk runs again).
func readWalkCache(path string) map[string]string {
	out := map[string]string{}
	if path == "" {
		return out
	}
	if b, err := os.ReadFile(path); err == nil {
		json.Unmarshal(b, &out)
	}
	return out
}

// writeWalkCache replaces the cache with found, the sockets bound now (a
// socket no longer bound drops out). A failure only costs the next start
// a walk.
func writeWalkCache(path string, found map[string]string) {
	if path == "" {
		return
	}
	if b, err := json.Marshal(found); err == nil {
		atomicfile.WriteFile(path, b, 0o600)
	}
}

// holdsBind reports whether a bind's source lies below hidden directory p
// (the agent's directories, in the hidden daemon home).
func (v *view) holdsBind(p string) bool {
	for _, b := range v.binds {
		if within(p, b.source) {
			return true
		}
	}
	return false
}

// devices are the devices of what the view shows: its top-level
// directories, the binds' sources, and the mounts below them.
func (v *view) devices() (map[uint64]bool, error) {
	devs := map[uint64]bool{}
	for _, p := range append(append([]string{}, v.tops...), v.sources()...) {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			devs[st.Dev] = true
		}
	}
	mounts, err := hostsock.Mounts()
	if err != nil {
		return nil, fmt.Errorf("read the host's mounts: %w", err)
	}
	for mp, dev := range mounts {
		if len(v.inside(mp)) > 0 {
			devs[dev] = true
		}
	}
	return devs, nil
}

func (v *view) sources() []string {
	var out []string
	for _, b := range v.binds {
		out = append(out, b.source)
	}
	return out
}

// located finds a socket by its name: an absolute name that leads to a
// socket with its device and inode (any socket, for a name known without
// its file), returned with the directories' links resolved (where the view
// would show it).
func located(s hostsock.Socket) (string, bool) {
	if !filepath.IsAbs(s.Name) {
		return "", false
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(s.Name))
	if err != nil {
		return "", false
	}
	p := filepath.Join(dir, filepath.Base(s.Name))
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return "", false
	}
	if s.Ino != 0 && (st.Dev != s.Dev || st.Ino != s.Ino) {
		return "", false
	}
	return p, true
}
