package protect

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/atomicfile"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
)

// A ledger records, for one daemon, the boundaries that run and the
// placeholders they made. Placeholders are mount points on the host: if one
// boundary removed its placeholders while another, started since, had bound
// them read-only, removing them would detach the other's mounts and with them
// its protection. So a run registers before it looks at its roots, and
// placeholders are removed only by the last run to end.
type ledger struct {
	path string
	lock *os.File
}

type ledgerData struct {
	Runs         []ledgerRun   `json:"runs"`
	Placeholders []placeholder `json:"placeholders"`
}

// ledgerRun identifies a running boundary by its shim process.
type ledgerRun struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// placeholder is one path Prepare made, relative to the root it is in: it
// is removed beneath that root, following no symlink.
type placeholder struct {
	Root string `json:"root"`
	Rel  string `json:"rel"`
}

// UnmarshalJSON reads a placeholder, or a plain path as releases before
// this one wrote them: an upgraded daemon's new runs share the ledger with
// the runs its old shims still serve.
func (p *placeholder) UnmarshalJSON(data []byte) error {
	var path string
	if json.Unmarshal(data, &path) == nil {
		p.Root, p.Rel = filepath.Dir(path), filepath.Base(path)
		return nil
	}
	type plain placeholder
	return json.Unmarshal(data, (*plain)(p))
}

func self() ledgerRun {
	start, _ := procstat.StartTime(os.Getpid())
	return ledgerRun{PID: os.Getpid(), StartTime: start}
}

// openLedger takes the ledger's lock (an flock, gone with the process).
func openLedger(path string) (*ledger, error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("placeholder ledger: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("placeholder ledger: %w", err)
	}
	return &ledger{path: path, lock: f}, nil
}

func (l *ledger) close() { l.lock.Close() }

// read returns the ledger without the runs whose shims are gone.
func (l *ledger) read() (*ledgerData, error) {
	var d ledgerData
	if err := atomicfile.ReadJSON(l.path, &d); err != nil && !errors.Is(err, fs.ErrNotExist) {
		var syntax *json.SyntaxError
		if !errors.As(err, &syntax) {
			return nil, err
		}
	}
	live := d.Runs[:0]
	for _, r := range d.Runs {
		if procstat.Alive(r.PID, r.StartTime) {
			live = append(live, r)
		}
	}
	d.Runs = live
	return &d, nil
}

func (l *ledger) write(d *ledgerData) error {
	return atomicfile.WriteVolatileJSON(l.path, d, 0o600)
}

// LedgerPath is the ledger of the daemon whose home is daemonHome.
func LedgerPath(daemonHome string) string {
	return filepath.Join(daemonHome, "run", "sandboxes.json")
}

// ReleaseDead takes the runs whose shims are gone off the ledger at path
// and, when no boundary runs any more, removes the placeholders: what a shim
// that was killed could not do itself.
func ReleaseDead(path string) { releaseRun(path) }

// releaseRun ends this process's run: it leaves the ledger, and when no other
// run is left, removes every placeholder that is still empty.
func releaseRun(path string) {
	l, err := openLedger(path)
	if err != nil {
		return
	}
	defer l.close()
	d, err := l.read()
	if err != nil {
		return
	}
	me := self()
	runs := d.Runs[:0]
	for _, r := range d.Runs {
		if r != me {
			runs = append(runs, r)
		}
	}
	d.Runs = runs
	if len(d.Runs) == 0 {
		removePlaceholders(d.Placeholders)
		d.Placeholders = nil
	}
	l.write(d)
}

// removePlaceholders deletes the placeholders in reverse order (parents were
// recorded before what is inside them). Only an empty directory or an empty
// file goes (a commondir placeholder holds ".\n"). Each is
// removed beneath its root without following a symlink, so a path swapped
// for one since cannot make it remove anything else.
func removePlaceholders(ps []placeholder) {
	roots := map[string]*os.File{}
	defer func() {
		for _, f := range roots {
			f.Close()
		}
	}()
	for i := len(ps) - 1; i >= 0; i-- {
		p := ps[i]
		root, ok := roots[p.Root]
		if !ok {
			fd, err := unix.Openat2(unix.AT_FDCWD, p.Root, &unix.OpenHow{
				Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS,
			})
			if err != nil {
				roots[p.Root] = nil
				continue
			}
			root = os.NewFile(uintptr(fd), p.Root)
			roots[p.Root] = root
		}
		if root == nil {
			continue
		}
		parent, err := openBeneath(root, filepath.Dir(p.Rel))
		if err != nil {
			continue
		}
		name := filepath.Base(p.Rel)
		var st unix.Stat_t
		if unix.Fstatat(int(parent.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			switch {
			case st.Mode&unix.S_IFMT == unix.S_IFDIR:
				unix.Unlinkat(int(parent.Fd()), name, unix.AT_REMOVEDIR) // fails, harmlessly, when not empty
			case st.Mode&unix.S_IFMT == unix.S_IFREG && (st.Size == 0 || name == "commondir" && st.Size == int64(len(".\n"))):
				unix.Unlinkat(int(parent.Fd()), name, 0)
			}
		}
		parent.Close()
	}
}
