package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentconnect-md/agentconnect/procstat"
)

func TestLedgerKeepsPlaceholdersWhileAnotherSandboxRuns(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sandboxes.json")
	ws := t.TempDir()
	placeholder := filepath.Join(ws, ".mcp.json")
	os.Mkdir(placeholder, 0o755)
	parentStart, _ := procstat.StartTime(os.Getppid())
	other := ledgerRun{PID: os.Getppid(), StartTime: parentStart} // alive: stands for another sandbox
	dead := ledgerRun{PID: 1 << 22, StartTime: 1}                 // no such process

	l, err := openLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	l.write(&ledgerData{Runs: []ledgerRun{self(), other, dead}, Placeholders: []string{placeholder}})
	l.close()

	releaseRun(path)
	if _, err := os.Stat(placeholder); err != nil {
		t.Fatalf("placeholder removed while another sandbox runs: %v", err)
	}
	l, _ = openLedger(path)
	d, _ := l.read()
	l.close()
	if len(d.Runs) != 1 || d.Runs[0] != other {
		t.Errorf("runs after release = %+v, want only the other (self left, the dead one pruned)", d.Runs)
	}

	// The last sandbox to end removes the placeholders.
	l, _ = openLedger(path)
	l.write(&ledgerData{Runs: []ledgerRun{self()}, Placeholders: []string{placeholder}})
	l.close()
	releaseRun(path)
	if _, err := os.Stat(placeholder); !os.IsNotExist(err) {
		t.Errorf("placeholder still there after the last sandbox ended: %v", err)
	}
}

func TestRemovePlaceholdersKeepsWhatIsNotEmpty(t *testing.T) {
	ws := t.TempDir()
	full := filepath.Join(ws, ".vscode")
	os.Mkdir(full, 0o755)
	os.WriteFile(filepath.Join(full, "tasks.json"), []byte("{}"), 0o644)
	file := filepath.Join(ws, ".bashrc")
	os.WriteFile(file, []byte("echo hi\n"), 0o644)
	removePlaceholders([]string{full, file})
	for _, p := range []string{full, file} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed though not empty: %v", p, err)
		}
	}
}
