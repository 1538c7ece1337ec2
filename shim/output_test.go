package shim

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
)

func limitMiB(n int64) func(*session.Spec) {
	return func(s *session.Spec) { s.OutputLimitMiB = n }
}

// checkOutputBound checks output.log against the documented bound: the
// limit plus one notice record.
func checkOutputBound(t *testing.T, dir session.Dir, limit int64) {
	t.Helper()
	fi, err := os.Stat(dir.OutputPath())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > limit+16+outputlog.MaxNotice {
		t.Errorf("output.log is %d bytes, over the limit %d plus one notice", fi.Size(), limit)
	}
	if fi.Size() < limit {
		t.Errorf("output.log is %d bytes, short of the limit %d: output was lost before it", fi.Size(), limit)
	}
}

// TestOutputLimitStopsTheRun: a runtime that writes past its session's
// output limit is stopped with SIGTERM, and the reason says why; the log
// ends with a notice and stays within the limit plus that notice.
func TestOutputLimitStopsTheRun(t *testing.T) {
	s := startShimIn(t, t.TempDir(), limitMiB(1), "sh", "-c", "echo start; exec yes 0123456789abcdef")
	ctx := context.Background()
	if _, err := s.client.Start(ctx, &shimv1.StartRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := s.client.Wait(ctx, &shimv1.WaitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if w.ExitCode != 143 || w.Reason != "output limit of 1 MiB reached; killed by signal 15 (SIGTERM)" {
		t.Errorf("exit %d, reason %q; want 143 and the output limit", w.ExitCode, w.Reason)
	}
	checkOutputBound(t, s.dir, 1<<20)
	stdout, stderr := readLog(t, s.dir)
	if !strings.HasPrefix(stdout, "start\n0123456789abcdef\n") || !strings.Contains(stderr, "output limit of 1 MiB reached") {
		t.Errorf("output: stdout starts %q, stderr %q", stdout[:min(len(stdout), 40)], stderr)
	}
	if st, _ := s.dir.ReadStatus(); st == nil || st.Reason != w.Reason {
		t.Errorf("status.json = %+v, want the reason %q", st, w.Reason)
	}
}

// TestOutputLimitKillsWhatIgnoresSIGTERM: a runtime that ignores SIGTERM
// and goes on writing is killed after the grace period, and what it wrote
// meanwhile is dropped.
func TestOutputLimitKillsWhatIgnoresSIGTERM(t *testing.T) {
	s := startShimIn(t, t.TempDir(), limitMiB(1), "sh", "-c", `trap "" TERM; exec yes 0123456789abcdef`)
	ctx := context.Background()
	if _, err := s.client.Start(ctx, &shimv1.StartRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := s.client.Wait(ctx, &shimv1.WaitRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if w.ExitCode != 137 || !strings.HasPrefix(w.Reason, "output limit of 1 MiB reached") {
		t.Errorf("exit %d, reason %q; want 137 and the output limit", w.ExitCode, w.Reason)
	}
	checkOutputBound(t, s.dir, 1<<20)
}

// TestFullOutputLogRefusesARun: a resumed session whose log is already at
// its limit does not start, with the reason.
func TestFullOutputLogRefusesARun(t *testing.T) {
	root := t.TempDir()
	dir := session.Dir(filepath.Join(root, "s"))
	os.Mkdir(string(dir), 0o700)
	w, err := outputlog.OpenWriter(dir.OutputPath(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for w.Write(outputlog.Stdout, make([]byte, 64<<10)) == nil {
	}
	w.Close()
	s := startShimIn(t, root, limitMiB(1), "sh", "-c", "echo should not run")
	_, err = s.client.Start(context.Background(), &shimv1.StartRequest{})
	if err == nil || !strings.Contains(err.Error(), "output limit of 1 MiB reached") {
		t.Fatalf("Start on a full log = %v, want the output limit", err)
	}
	if st, _ := s.dir.ReadStatus(); st == nil || st.State != session.Exited || !strings.Contains(st.Reason, "output.log is full") {
		t.Errorf("status.json = %+v", st)
	}
	if stdout, _ := readLog(t, dir); strings.Contains(stdout, "should not run") {
		t.Error("the runtime ran")
	}
}

// A helper that writes without end fills the shim's log with at most
// maxHelperLines lines and one note.
func TestLogHelperIsBounded(t *testing.T) {
	var logged bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logged)
	s := &service{log: logrus.NewEntry(log)}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.logHelper(r, "virtiofsd", "workspace"); close(done) }()
	for i := 0; i < 10*maxHelperLines; i++ {
		fmt.Fprintf(w, "complaint %d\n", i)
	}
	w.Close()
	<-done
	if n := strings.Count(logged.String(), "\n"); n != maxHelperLines+1 {
		t.Errorf("%d lines logged for %d written, want %d and the note", n, 10*maxHelperLines, maxHelperLines)
	}
	if !strings.Contains(logged.String(), "the rest is dropped") {
		t.Errorf("no note that the rest was dropped:\n%s", logged.String())
	}
}
