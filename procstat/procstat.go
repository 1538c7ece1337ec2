// Package procstat reads process liveness from /proc/PID/stat. A zombie is
// dead, and a recorded start time tells a live process from a reused pid:
// kill(pid, 0) can tell neither.
package procstat

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
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
