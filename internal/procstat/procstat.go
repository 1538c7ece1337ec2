// Package procstat reads process liveness from /proc/PID/stat. A zombie is
// dead, and a recorded start time tells a live process from a reused pid:
// kill(pid, 0) can tell neither. A pid read from a file is signalled only
// through Signal, SignalGroup and Kill, which check the start time first.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Stat is what this package reads from /proc/PID/stat.
type Stat struct {
	PID       int
	State     byte   // R, S, D, Z, X, T, ...
	PPID      int    // parent pid
	PGID      int    // process group
	StartTime uint64 // clock ticks after boot; with PID, identifies one process
}

// Read reads /proc/PID/stat.
func Read(pid int) (Stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return parse(pid, data)
}

// parse reads the fields after the command name, which is in parentheses and
// may itself contain spaces and parentheses: the last ')' ends it.
func parse(pid int, data []byte) (Stat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 || end+2 >= len(data) {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: no command field", pid)
	}
	f := bytes.Fields(data[end+2:])
	// f[0] is field 3 (state); start time is field 22.
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: %d fields, want at least 22", pid, len(f)+2)
	}
	st := Stat{PID: pid, State: f[0][0]}
	var err error
	if st.PPID, err = strconv.Atoi(string(f[1])); err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: ppid: %w", pid, err)
	}
	if st.PGID, err = strconv.Atoi(string(f[2])); err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: pgrp: %w", pid, err)
	}
	if st.StartTime, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: starttime: %w", pid, err)
	}
	return st, nil
}

// Dead reports whether the state is a zombie or a dead task.
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' || s.State == 'x' }

// Alive reports whether pid is a live (non-zombie) process. When startTime is
// not zero it must match, so that a reused pid does not count as alive.
func Alive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := Read(pid)
	if err != nil {
		return false
	}
	if st.Dead() {
		return false
	}
	return startTime == 0 || st.StartTime == startTime
}

// Children lists the processes whose parent is ppid, exited ones not yet
// reaped (zombies) among them.
func Children(ppid int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := Read(pid); err == nil && st.PPID == ppid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// StartTime returns the start time of pid, for recording beside it.
func StartTime(pid int) (uint64, error) {
	st, err := Read(pid)
	if err != nil {
		return 0, err
	}
	return st.StartTime, nil
}

// Group lists the live processes of process group pgid.
func Group(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := Read(pid); err == nil && st.PGID == pgid && !st.Dead() {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ErrNotSame is returned when a pid names a process other than the one
// recorded: the recorded one ended and its pid was reused, or no start time
// was recorded to tell.
var ErrNotSame = errors.New("the pid names another process now")

// open returns a pidfd for pid once it is the live process that started at
// startTime. The pidfd is opened first and the process identified after:
// if the process ended and its pid was reused in between, the start time
// read is the new process's and does not match, so a pidfd that passes
// refers to the recorded process (which existed before the pidfd was
// opened), and anything sent through it reaches that process or nothing.
func open(pid int, startTime uint64) (int, error) {
	if pid <= 1 || startTime == 0 {
		return -1, ErrNotSame
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, err
	}
	st, err := Read(pid)
	if err != nil || st.Dead() {
		unix.Close(fd)
		return -1, unix.ESRCH
	}
	if st.StartTime != startTime {
		unix.Close(fd)
		return -1, ErrNotSame
	}
	return fd, nil
}

// Signal sends sig to pid only if it is still the process that started at
// startTime, through a pidfd (see open). It returns ESRCH when the process
// is gone and ErrNotSame when the pid names another process.
func Signal(pid int, startTime uint64, sig unix.Signal) error {
	fd, err := open(pid, startTime)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// SignalGroup sends sig to the process group pid leads, only if pid is
// still the process that started at startTime; when pid leads no group (it
// joined another), to pid alone.
//
// Why a live leader is enough, and a dead one is not: a process group's id
// is its creator's pid, and that pid number is not handed out again while
// the group exists (nor while the leader lives). So while the recorded
// leader lives, with its start time, group pid is its group. Once the leader
// is dead, a group of that id may still be its own (members outliving it) or
// one made since by an unrelated process that was given the freed number,
// created its own group and exited (the usual way a daemon detaches); the
// members' start times cannot tell the two apart. So a dead leader's group is
// not signalled: a session's cgroup, which only its own processes are in,
// is how what is left of it is found.
//
// kill(-pid) is a second step after the check: between the two, the leader
// and every member would have to end and the pid be handed out again to a
// new group's creator, which takes a full turn of the pid space.
func SignalGroup(pid int, startTime uint64, sig unix.Signal) error {
	fd, err := open(pid, startTime)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Kill(-pid, sig); err != unix.ESRCH {
		return err
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// Kill sends SIGKILL to pid, only if it is still the process that started
// at startTime, and waits until it has died (a zombie counts as dead) or
// timeout has passed. A process already gone, or a pid that names another
// process, is not an error: what was asked for, that the recorded process
// is not running, holds.
func Kill(pid int, startTime uint64, timeout time.Duration) error {
	fd, err := open(pid, startTime)
	if err == unix.ESRCH || err == ErrNotSame {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && err != unix.ESRCH {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	// A pidfd becomes readable when its process dies.
	deadline := time.Now().Add(timeout)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms < 0 {
			return fmt.Errorf("kill pid %d: still alive %v after SIGKILL", pid, timeout)
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("kill pid %d: wait: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
	}
}
