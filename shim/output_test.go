package shim

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

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
