package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentconnect-md/agentconnect/api/session"
	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
)

const (
	// recoverWorkers bounds how many session directories are read and how
	// many shims are dialled at once on startup.
	recoverWorkers = 64
	// readoptInterval is how often a shim that is alive but did not answer
	// is tried again.
	readoptInterval = time.Second
)

// recoverSessions reads every session directory in parallel, reconnects to
// the live shims, reconciles each session from its shim or its files, and
// cleans up after the dead. Every step has a short deadline: a wedged or
// missing shim never holds up the start.
func (s *Supervisor) recoverSessions() {
	entries, err := os.ReadDir(s.layout.SessionsDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.WithError(err).Error("read sessions")
		return
	}
	var ids []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".removing-") {
			os.RemoveAll(filepath.Join(s.layout.SessionsDir(), name)) // a removal a crash interrupted
			continue
		}
		if e.IsDir() && !strings.HasPrefix(name, ".") {
			ids = append(ids, name)
		}
	}
	start := time.Now()
	results := make([]*sessionState, len(ids))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(recoverWorkers, len(ids)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				results[i] = s.recoverSession(ids[i])
			}
		}()
	}
	for i := range ids {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	live := map[string]bool{}
	adopted := 0
	s.mu.Lock()
	for _, ss := range results {
		if ss == nil {
			continue
		}
		s.sessions[ss.id] = ss
		if conn := ss.connection(); conn != nil {
			live[conn.address] = true
			adopted++
			go s.monitor(ss, conn, ss.record().Run)
		} else if ss.isRunning() {
			if boot, _ := ss.dir.ReadBootstrap(); boot != nil {
				live[boot.Address] = true
			}
		}
	}
	s.mu.Unlock()
	s.removeStraySockets(live)
	s.removeStrayCgroups()
	s.removeStrayVMs()
	if len(ids) > 0 {
		s.log.WithFields(map[string]any{"sessions": len(ids), "adopted": adopted, "took": time.Since(start).Round(time.Millisecond).String()}).Info("sessions recovered")
	}
}

// removeStrayVMs removes the VM directories (disks, console log) that
// belong to no session: a supervisor killed while it removed a session, or
// a warm VM, leaves one. No VM runs from them: its session would be known.
func (s *Supervisor) removeStrayVMs() {
	entries, _ := os.ReadDir(s.layout.VMsDir())
	for _, e := range entries {
		s.mu.Lock()
		_, known := s.sessions[e.Name()]
		s.mu.Unlock()
		if known {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.layout.VMsDir(), e.Name())); err != nil {
			s.log.WithError(err).WithField("session", e.Name()).Warn("remove a stray VM directory")
			continue
		}
		s.log.WithField("session", e.Name()).Info("removed the VM directory of no session")
	}
}

// removeStrayCgroups kills and removes the session cgroups of this daemon
// that belong to no session: a supervisor killed after it made a session's
// cgroup and before it wrote the session's record leaves one (the record,
// which names it, is what recovery goes by).
func (s *Supervisor) removeStrayCgroups() {
	if s.cgroups == nil {
		return
	}
	for id, cg := range s.cgroups.Sessions() {
		s.mu.Lock()
		_, known := s.sessions[id]
		s.mu.Unlock()
		if known {
			continue
		}
		log := s.log.WithField("session", id)
		if err := cg.Kill(killWait); err != nil {
			log.WithError(err).Warn("kill what is in a stray session cgroup")
		}
		if err := cg.Remove(); err != nil {
			log.WithError(err).Warn("remove a stray session cgroup")
			continue
		}
		log.Info("removed the cgroup of a start that never recorded its session")
	}
}

// recoverSession reconciles one session directory. It returns nil for a
// directory that is not a session (a start that never wrote session.json),
// after removing it.
func (s *Supervisor) recoverSession(id string) *sessionState {
	dir := session.Dir(s.layout.SessionDir(id))
	log := s.log.WithField("session", id)
	rec, err := dir.ReadRecord()
	if errors.Is(err, fs.ErrNotExist) {
		s.removeSessionFiles(id)
		return nil
	}
	if err != nil {
		log.WithError(err).Error("skipping a session whose session.json cannot be read")
		return nil
	}
	if rec.Warm {
		// A warm boundary of an earlier supervisor, never claimed: this one
		// builds its own, from what a start now builds.
		s.removeWarmLeftover(dir, rec)
		log.Info("removed a warm boundary no session claimed")
		return nil
	}
	ss := newSessionState(dir, rec)
	log = log.WithField("agent", rec.Agent)
	st, _ := dir.ReadStatus()
	if st != nil && st.Run == rec.Run && st.State != session.Running {
		ss.setEnded(st)
		s.removeRunLeftovers(rec)
		return ss
	}
	boot, _ := dir.ReadBootstrap()
	if boot == nil || boot.Run != rec.Run {
		ss.setEnded(s.lose(rec, st, "the supervisor stopped while this run was starting"))
		log.Warn("session lost: its run never got a shim")
		return ss
	}
	gone := func() *sessionState {
		if st2, _ := dir.ReadStatus(); st2 != nil && st2.Run == rec.Run && st2.State != session.Running {
			ss.setEnded(st2)
			s.removeRunLeftovers(rec)
			return ss
		}
		ss.setEnded(s.lose(rec, st, fmt.Sprintf("shim (pid %d) is gone and recorded no exit", boot.PID)))
		log.Warn("session lost: its shim is gone")
		return ss
	}
	if !procstat.Alive(boot.PID, boot.StartTime) {
		return gone()
	}
	if err := s.adopt(ss, boot); err != nil {
		// A shim that closed the connection may be dying (killed just
		// before this start): it is gone once it is, not unanswering.
		if errors.Is(err, ttrpclite.ErrClosed) && diesWithin(boot.PID, boot.StartTime, time.Second) {
			return gone()
		}
		pid := 0
		if st != nil {
			pid = st.PID
		}
		ss.setUnanswered(pid, boot.PID, fmt.Sprintf("shim (pid %d) is alive but not answering: %v", boot.PID, err))
		log.WithError(err).Warn("shim not answering; will try again")
		go s.readopt(ss, boot)
	}
	return ss
}

// diesWithin reports whether pid is dead, or dies within d.
func diesWithin(pid int, startTime uint64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for procstat.Alive(pid, startTime) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// adopt connects to a live shim and takes the session's state from it.
func (s *Supervisor) adopt(ss *sessionState, boot *session.Bootstrap) error {
	conn, err := dialShim(s.ctx, boot, adoptTimeout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, adoptTimeout)
	defer cancel()
	state, err := conn.shim.State(ctx, &shimv1.StateRequest{})
	if err != nil {
		conn.close()
		return fmt.Errorf("state: %w", err)
	}
	rec := ss.record()
	switch state.Status {
	case shimv1.Status_CREATED:
		// The supervisor stopped between starting the shim and starting
		// the runtime: finish the start that was asked for, beginning with
		// the cgroup it made beside the shim's start (it may not have).
		if err := s.finishCgroup(rec); err != nil {
			ss.setEnded(s.failedStart(ss, rec, conn, boot, err, adoptTimeout))
			return nil
		}
		resp, err := conn.shim.Start(ctx, &shimv1.StartRequest{})
		if err != nil {
			if st, _ := ss.dir.ReadStatus(); st != nil && st.Run == rec.Run && st.State != session.Running {
				// It failed and said why: nothing of it stays.
				ss.setEnded(s.failedStart(ss, rec, conn, boot, err, adoptTimeout))
				return nil
			}
			// Still starting (a VM booting): adopted once it answers.
			conn.close()
			return fmt.Errorf("start: %w", err)
		}
		ss.setRunning(conn, int(resp.Pid), time.Now())
	case shimv1.Status_RUNNING:
		ss.setRunning(conn, int(state.Pid), state.StartedAt)
	default:
		// Exited: its status.json is written; collect it.
		conn.shim.Shutdown(ctx, &shimv1.ShutdownRequest{})
		conn.close()
		st, _ := ss.dir.ReadStatus()
		if st == nil || st.Run != rec.Run {
			st = &session.Status{Run: rec.Run, State: session.Exited, ExitCode: int(state.ExitCode), Reason: state.Reason,
				PID: int(state.Pid), StartedAt: state.StartedAt, ExitedAt: state.ExitedAt}
		}
		ss.setEnded(st)
		s.removeRunLeftovers(rec)
		return nil
	}
	s.events.add(event{Type: "session.adopted", SessionID: ss.id, Agent: rec.Agent, Message: fmt.Sprintf("shim pid %d", boot.PID)})
	return nil
}

// finishCgroup makes the cgroup a start named in the session's record, for
// a start the supervisor was killed in: the shim joins the runtime to it.
// Making it again is harmless: what exists stays, the limits are set again.
func (s *Supervisor) finishCgroup(rec *session.Record) error {
	if len(rec.Spec.Cgroup) == 0 {
		return nil
	}
	if s.cgroups == nil || !slices.Equal(s.cgroups.Dirs(rec.ID), rec.Spec.Cgroup) {
		return fmt.Errorf("the session's cgroup %s is not where this daemon makes cgroups (was the daemon moved to another cgroup?); start the session again", rec.Spec.Cgroup[0])
	}
	_, err := s.cgroups.Create(rec.ID, rec.Spec.Limits)
	return err
}

// readopt keeps trying a shim that is alive but did not answer, until it
// answers, dies, or the supervisor stops.
func (s *Supervisor) readopt(ss *sessionState, boot *session.Bootstrap) {
	t := time.NewTicker(readoptInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		// The session's own mark, not the supervisor's map: recovery starts
		// this before it puts its sessions in the map, and a recovery
		// slower than one tick (a VM restoring under load) ended it there,
		// leaving the session running after its shim had exited.
		if ss.isRemoved() || ss.record().Run != boot.Run {
			return
		}
		if !procstat.Alive(boot.PID, boot.StartTime) {
			s.collectDeadShim(ss, boot.Run, boot.PID, boot.StartTime)
			return
		}
		if err := s.adopt(ss, boot); err == nil {
			if conn := ss.connection(); conn != nil {
				s.sessionLog(ss).Info("shim answers again; session adopted")
				go s.monitor(ss, conn, boot.Run)
			}
			return
		}
	}
}

// removeStraySockets deletes shim sockets that no live shim owns.
func (s *Supervisor) removeStraySockets(live map[string]bool) {
	entries, _ := os.ReadDir(s.socketDir)
	for _, e := range entries {
		path := filepath.Join(s.socketDir, e.Name())
		if e.Name() == home.AdminSocketName || !strings.HasSuffix(e.Name(), ".sock") || live[path] {
			continue
		}
		os.Remove(path)
	}
}
