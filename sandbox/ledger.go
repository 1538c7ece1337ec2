package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/atomicfile"
	"github.com/agentconnect-md/agentconnect/procstat"
)

// A ledger records, for one daemon, the sandboxes that run and the
// placeholders they made. Placeholders are mount points on the host: if one
// sandbox removed its placeholders while another, started since, had bound
// them read-only, removing them would detach the other's mounts and with
// them its protection. So a sandbox registers before it looks at its
// directories, and placeholders are removed only by the last sandbox to end.
type ledger struct {
	path string
	lock *os.File
}

type ledgerData struct {
	Runs         []ledgerRun `json:"runs"`
	Placeholders []string    `json:"placeholders"`
}

// ledgerRun identifies a running sandbox by its shim process.
type ledgerRun struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

func self() ledgerRun {
	start, _ := procstat.StartTime(os.Getpid())
	return ledgerRun{PID: os.Getpid(), StartTime: start}
}

// openLedger takes the ledger's lock (an flock, gone with the process).
func openLedger(path string) (*ledger, error) {
	f, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox ledger: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox ledger: %w", err)
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
// and, when no sandbox runs any more, removes the placeholders: what a shim
// that was killed could not do itself.
func ReleaseDead(path string) { releaseRun(path) }

// release ends a sandbox's run: it leaves the ledger, and when no other
// sandbox runs, removes every placeholder that is still an empty mount
// point.
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

// removePlaceholders deletes the empty mount points the sandboxes made, in
// reverse order (parents were recorded before what is inside them); a path
// that is no longer empty is left alone.
func removePlaceholders(paths []string) {
	for i := len(paths) - 1; i >= 0; i-- {
		p := paths[i]
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if (fi.Mode().IsRegular() && fi.Size() == 0) || fi.IsDir() {
			os.Remove(p) // fails, harmlessly, on a directory that is not empty
		}
	}
}
