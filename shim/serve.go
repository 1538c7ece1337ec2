package shim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
	"github.com/agentconnect-md/agentconnect/internal/version"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// exitLinger is how long a shim whose runtime has exited waits for the
// supervisor to collect the exit (Wait, then Shutdown) before it exits on its
// own. The exit is in status.json either way.
const exitLinger = 5 * time.Second

// shutdownGrace bounds how long an exiting shim waits for in-flight calls
// (a Wait about to return the exit) before it closes its connections.
const shutdownGrace = 2 * time.Second

// process is what a serving shim sets up of its own process, before and
// whatever its session: a spare (shimv1.StartSpare) does it while it waits
// for one, so that a start does not.
type process struct {
	log              *logrus.Logger
	reaper           *reaper
	sigchld, sigterm chan os.Signal
	// startTime identifies this process with its pid (procstat).
	startTime uint64
}

// setupProcess makes this process a shim: no core dumps, a small heap, the
// child subreaper that reaps all the runtime leaves, and signal handling.
func setupProcess() (*process, error) {
	// A shim may hold secrets' values (a run's private env): no core dump
	// of it, no ptrace or /proc/PID/mem by another process of this user.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// A shim idles for hours: keep its heap and threads small.
	debug.SetGCPercent(40)
	runtime.GOMAXPROCS(2)
	resetOOMScore("/proc/self/oom_score_adj")
	// Orphans of the runtime are reparented here, not to init, so that the
	// shim reaps them and can kill what is left of the session.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("become a child subreaper: %w", err)
	}
	log := logrus.New()
	log.SetFormatter(&logrus.JSONFormatter{})
	start, err := procstat.StartTime(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("read the shim's own start time: %w", err)
	}
	p := &process{log: log, reaper: newReaper(), sigchld: make(chan os.Signal, 1), sigterm: make(chan os.Signal, 1), startTime: start}
	warmCaches()
	signal.Notify(p.sigchld, syscall.SIGCHLD)
	go p.reaper.run(p.sigchld)
	signal.Notify(p.sigterm, syscall.SIGTERM, syscall.SIGINT)
	return p, nil
}

// warmCaches does the once-per-process work a start would otherwise pay:
// encoding/json's field cache of the records a start reads and writes, and
// the os package's check that pidfds work (a fork of a child that exits at
// once, made before the first process the shim starts; os.FindProcess
// runs it).
func warmCaches() {
	json.Unmarshal([]byte("{}"), new(session.Record))
	json.Marshal(&session.Bootstrap{})
	json.Marshal(&session.Status{})
	if self, err := os.FindProcess(os.Getpid()); err == nil {
		self.Release()
	}
}

// serve is the long-lived shim of the session run in dirPath, in the
// process p set up (nil: serve sets it up).
func serve(dirPath, socket string, runners map[strategy.Name]Runner, p *process) error {
	readyW := os.NewFile(shimv1.FDReady, "ready")
	fail := func(err error) error {
		json.NewEncoder(readyW).Encode(shimv1.Ready{Error: err.Error()})
		readyW.Close()
		return err
	}
	if p == nil {
		var err error
		if p, err = setupProcess(); err != nil {
			return fail(err)
		}
	}
	l, err := net.FileListener(os.NewFile(shimv1.FDListener, "listener"))
	if err != nil {
		return fail(fmt.Errorf("inherit listener: %w", err))
	}
	dir := session.Dir(dirPath)
	rec, err := dir.ReadRecord()
	if err != nil {
		return fail(fmt.Errorf("read session: %w", err))
	}
	entry := p.log.WithFields(logrus.Fields{"session": rec.ID, "run": rec.Run})

	out, err := outputlog.OpenWriter(dir.OutputPath(), rec.Spec.OutputLimit()<<20)
	if err != nil {
		return fail(err)
	}
	svc := newService(rec, dir, out, entry, runners, p.reaper)
	sigterm := p.sigterm

	srv := ttrpclite.NewServer(true) // the supervisor runs as this shim's user
	shimv1.RegisterShimService(srv, svc)
	go srv.Serve(l)

	start := p.startTime
	if err := dir.WriteBootstrap(&session.Bootstrap{
		Address: socket, PID: os.Getpid(), StartTime: start,
		APIVersion: shimv1.APIVersion, Version: version.Version, Run: rec.Run,
	}); err != nil {
		return fail(err)
	}
	if rec.Warm {
		// Ready once the run is prepared: the supervisor adds only
		// prepared shims to its warm pool.
		if err := svc.prepareWarm(); err != nil {
			return fail(fmt.Errorf("prepare the warm boundary: %w", err))
		}
	}
	if err := json.NewEncoder(readyW).Encode(shimv1.Ready{PID: os.Getpid(), StartTime: start}); err != nil {
		// The bootstrap is gone: no supervisor will know this shim.
		svc.discardWarm()
		return err
	}
	readyW.Close()
	entry.WithField("pid", os.Getpid()).Info("shim serving")

	for done := false; !done; {
		select {
		case <-svc.exited:
			select {
			case <-svc.shutdown:
			case <-time.After(exitLinger):
			}
			done = true
		case <-svc.shutdown:
			done = true
		case sig := <-sigterm:
			// Someone asked the shim itself to stop: end the run the way
			// session stop would, and exit once it is recorded.
			entry.WithField("signal", sig).Info("shim signalled; stopping the runtime")
			if !svc.signalAll(syscall.SIGTERM) {
				done = true
			}
		}
	}
	svc.discardWarm() // a warm boundary no session claimed
	select {
	case <-svc.exited: // a run ended: its leftovers go before the shim does
		<-svc.cleanedUp
	default: // no run was started
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	srv.Shutdown(ctx)
	srv.Close()
	os.Remove(socket)
	out.Close()
	entry.Info("shim exiting")
	return nil
}

// resetOOMScore sets a negative oom_score_adj inherited from the supervisor
// (systemd favours it) back to 0, for the shim and so for its runtime: a
// runaway session must not be shielded from the OOM killer. Raising the
// score needs no privilege.
func resetOOMScore(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	if v, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && v < 0 {
		os.WriteFile(path, []byte("0"), 0)
	}
}
