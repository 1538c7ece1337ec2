package shim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/agentconnect-md/agentconnect/internal/outputlog"
)

// maxConsole bounds a VM's console.log: its kernel's and guest agent's log.
const maxConsole = 1 << 20

// copyConsole copies a VM's serial console from QEMU to path, up to
// maxConsole bytes, then says so and drops the rest: the guest writes to
// its serial port at will.
func (s *service) copyConsole(r *os.File, path string) {
	defer r.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		s.log.WithError(err).Warn("open the VM's console.log; its console is dropped")
		io.Copy(io.Discard, r)
		return
	}
	n, _ := io.Copy(f, io.LimitReader(r, maxConsole))
	if n == maxConsole {
		fmt.Fprintf(f, "\n[agentconnect: console.log keeps the first %d bytes; the rest is dropped]\n", maxConsole)
	}
	f.Close()
	io.Copy(io.Discard, r)
}

// maxHelperLines bounds what a helper (virtiofsd) may write into the
// shim's log per run: it answers the guest, which could make it complain
// at will.
const maxHelperLines = 100

// logHelper logs what a helper process writes, a line at a time, up to
// maxHelperLines, then drops the rest, saying so once.
func (s *service) logHelper(r *os.File, helper, share string) {
	defer r.Close()
	log := s.log.WithFields(logrus.Fields{"helper": helper, "share": share})
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 4096)
	lines := 0
	for sc.Scan() {
		if lines++; lines <= maxHelperLines {
			log.Warn(strings.TrimSpace(sc.Text()))
		} else if lines == maxHelperLines+1 {
			log.Warnf("%s said more than %d lines; the rest is dropped", helper, maxHelperLines)
		}
	}
	io.Copy(io.Discard, r) // a line too long for the scanner: drop what is left
}

// outputLimitGrace is how long a run that reached its output limit has
// between SIGTERM and SIGKILL, as `session stop` gives by default.
const outputLimitGrace = 10 * time.Second

// copyOutput copies one of the runtime's output streams to the log. Once the
// log is full it goes on reading, and drops what it reads, so that a
// runtime blocked on a full pipe can still act on the SIGTERM that ends it.
func (s *service) copyOutput(f io.Reader, stream outputlog.Stream, wg *sync.WaitGroup) {
	defer wg.Done()
	br := bufio.NewReaderSize(f, 32<<10)
	buf := make([]byte, 32<<10)
	for {
		n, err := br.Read(buf)
		if n > 0 {
			s.writeOutput(stream, buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// writeOutput appends p to the log as stream's: a full log stops the run;
// a full disk holds the output until there is room (the runtime waits on
// its pipe meanwhile, so no byte is lost); another error is logged once.
func (s *service) writeOutput(stream outputlog.Stream, p []byte) {
	for len(p) > 0 {
		// One record at a time: a record the disk refused is written again
		// whole, and none before it twice.
		n := min(len(p), outputlog.MaxPayload)
		if !s.writeRecord(stream, p[:n]) {
			return
		}
		p = p[n:]
	}
}

// diskFull tells the errors that go once the disk has room again.
func diskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// untilRoom calls write until it succeeds or fails for another reason than
// a full disk: what the shim must record (the runtime's output, a run's
// status) waits for room rather than being lost. what names it in the log,
// once when the disk is full and once when there is room again.
func (s *service) untilRoom(what string, write func() error) error {
	var held time.Time
	wait := 10 * time.Millisecond
	for {
		err := write()
		if !diskFull(err) {
			if !held.IsZero() {
				s.log.WithField("held", time.Since(held).Round(time.Millisecond)).Infof("%s: the disk has room again", what)
			}
			return err
		}
		if held.IsZero() {
			held = time.Now()
			s.log.WithError(err).Errorf("%s: the session directory's disk is full; held until there is room", what)
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Second)
	}
}

// writeRecord writes one record of at most MaxPayload bytes, holding it
// while the disk is full (the runtime waits on its pipe meanwhile). It
// returns false when the rest of the output is to be dropped (the log
// reached its limit).
func (s *service) writeRecord(stream outputlog.Stream, p []byte) bool {
	switch err := s.untilRoom("the runtime's output", func() error { return s.out.Write(stream, p) }); {
	case errors.Is(err, outputlog.ErrFull):
		s.outputLimitReached()
		return false
	case err != nil:
		s.outputError(err)
	}
	return true
}

// outputError logs an error writing the output log once, not once a write:
// a full disk must not fill shim.log as well.
func (s *service) outputError(err error) {
	s.mu.Lock()
	repeated := err.Error() == s.outputErr
	s.outputErr = err.Error()
	s.mu.Unlock()
	if !repeated {
		s.log.WithError(err).Error("write output log (repeats are not logged)")
	}
}

// outputLimitReason says why a run stopped at its output limit.
func (s *service) outputLimitReason() string {
	return fmt.Sprintf("output limit of %d MiB reached", s.rec.Spec.OutputLimit())
}

// outputLimitReached ends the output with a notice, once, and has the run
// stopped.
func (s *service) outputLimitReached() {
	s.outFullOnce.Do(func() {
		reason := s.outputLimitReason()
		s.log.Warn(reason + "; stopping the run")
		notice := fmt.Sprintf("agentconnect: %s (outputLimitMiB in the daemon's config.json); the run is stopped and its output is dropped\n", reason)
		if err := s.out.WriteNotice(outputlog.Stderr, []byte(notice)); err != nil {
			s.outputError(err)
		}
		s.mu.Lock()
		s.outputLimited = true
		s.mu.Unlock()
		close(s.outFull)
	})
}

// stopAtOutputLimit ends a run whose output reached the limit the way
// `session stop` does: SIGTERM to every process of the session, SIGKILL
// after outputLimitGrace.
func (s *service) stopAtOutputLimit() {
	select {
	case <-s.outFull:
	case <-s.exited:
		return
	}
	s.signalAll(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(outputLimitGrace):
		s.signalAll(syscall.SIGKILL)
	}
}
