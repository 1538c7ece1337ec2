// Package cgroupfs works on a session's cgroup through its directories:
// adding, listing and killing processes, reading counters, removing it. It
// uses only the filesystem, so that the shim stays small; creating a cgroup
// with limits is the limits package's job.
package cgroupfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Cgroup is one cgroup: its directory in each mounted hierarchy (one on a
// cgroup v2 host, one per controller on a v1 host).
type Cgroup struct {
	Dirs []string
}

// Add moves pid into the cgroup in every hierarchy.
func (c Cgroup) Add(pid int) error {
	for _, d := range c.Dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("add pid %d to cgroup %s: %w", pid, d, err)
		}
	}
	return nil
}

// Procs lists the processes in the cgroup, children included, but never
// the caller: a thread of the shim passes through the cgroup as it forks
// the runtime (EnterThread), and killing what the cgroup lists must not
// kill the shim.
func (c Cgroup) Procs() ([]int, error) {
	seen := map[int]bool{os.Getpid(): true}
	var pids []int
	for _, d := range c.Dirs {
		err := filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			if !e.IsDir() {
				return nil
			}
			data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil
				}
				return err
			}
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list cgroup %s: %w", d, err)
		}
	}
	return pids, nil
}

// Kill sends SIGKILL to every process in the cgroup until it is empty or
// the timeout passes. A process forking while it is killed is caught on the
// next round.
func (c Cgroup) Kill(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		pids, err := c.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		killed, err := c.killListed(pids)
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			closeAll(killed)
			return fmt.Errorf("cgroup %s still has %d processes after %v", c.Dirs[0], len(pids), timeout)
		}
		// A process leaves the cgroup as it exits: the next round comes
		// once those killed have exited (5 ms at most), not after a fixed
		// sleep, which was most of a session's exit.
		awaitExit(killed, 5*time.Millisecond)
		closeAll(killed)
	}
}

// killListed kills the processes of pids that are still in the cgroup, and
// returns the pidfds of those it signalled, for the caller to close. A
// pid read from cgroup.procs may have ended and been reused outside the
// cgroup since, so each is opened as a pidfd first and signalled through it
// only if the cgroup still lists it after: a pidfd that outlived its
// process signals nothing, and one opened on a reused pid outside the
// cgroup is not listed.
func (c Cgroup) killListed(pids []int) ([]int, error) {
	fds := map[int]int{}
	for _, pid := range pids {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			fds[pid] = fd
		}
	}
	still, err := c.Procs()
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, err
	}
	var killed []int
	for _, pid := range still {
		if fd, ok := fds[pid]; ok {
			unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			killed = append(killed, fd)
			delete(fds, pid)
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return killed, nil
}

// awaitExit waits until every process of the pidfds has exited (a pidfd
// polls readable then), at most d. With none (what was listed had exited
// already, or could not be opened), it waits a millisecond: the caller
// looks again, and must not spin.
func awaitExit(pidfds []int, d time.Duration) {
	if len(pidfds) == 0 {
		time.Sleep(min(d, time.Millisecond))
		return
	}
	deadline := time.Now().Add(d)
	polls := make([]unix.PollFd, 0, len(pidfds))
	for _, fd := range pidfds {
		polls = append(polls, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	for len(polls) > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		ts := unix.NsecToTimespec(left.Nanoseconds())
		if n, err := unix.Ppoll(polls, &ts, nil); err != nil && err != unix.EINTR {
			return
		} else if n <= 0 {
			continue
		}
		waiting := polls[:0]
		for _, p := range polls {
			if p.Revents == 0 {
				waiting = append(waiting, p)
			}
		}
		polls = waiting
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Remove deletes the cgroup's directories, children first. It fails while
// processes (zombies included) remain.
func (c Cgroup) Remove() error {
	var errs []error
	for _, d := range c.Dirs {
		var dirs []string
		filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// The cpu controller's weights: the least (background work) and the
// default, in v1 (cpu.shares) and v2 (cpu.weight).
var cpuWeights = []struct {
	file               string
	background, normal string
}{{"cpu.shares", "2", "1024"}, {"cpu.weight", "1", "100"}}

// SetBackground gives the cgroup the cpu controller's least weight, or
// with background false its default one back: a warm boundary being built
// yields the CPU to the sessions that run. Where the cpu controller is not
// in the cgroup's hierarchies, it does nothing.
func (c Cgroup) SetBackground(background bool) error {
	for _, d := range c.Dirs {
		for _, w := range cpuWeights {
			v := w.normal
			if background {
				v = w.background
			}
			// Not os.WriteFile: a cgroup directory refuses to create a
			// file another controller has (EACCES), where open says ENOENT.
			f, err := os.OpenFile(filepath.Join(d, w.file), os.O_WRONLY, 0)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err == nil {
				_, err = f.WriteString(v)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				return fmt.Errorf("cgroup %s: set %s: %w", d, w.file, err)
			}
		}
	}
	return nil
}

// Stats are a few counters of the cgroup.
type Stats struct {
	MemoryBytes uint64
	Pids        uint64
	CPUUsageNs  uint64
}

// Stats reads the counters from whichever hierarchy has them.
func (c Cgroup) Stats() Stats {
	var s Stats
	for _, d := range c.Dirs {
		if v, ok := readUint(d, "memory.current"); ok { // v2
			s.MemoryBytes = v
		}
		if v, ok := readUint(d, "memory.usage_in_bytes"); ok { // v1
			s.MemoryBytes = v
		}
		if v, ok := readUint(d, "pids.current"); ok {
			s.Pids = v
		}
		if v, ok := readUint(d, "cpuacct.usage"); ok { // v1, ns
			s.CPUUsageNs = v
		}
		if v, ok := readKey(d, "cpu.stat", "usage_usec"); ok { // v2, µs
			s.CPUUsageNs = v * 1000
		}
	}
	return s
}

func readUint(dir, file string) (uint64, bool) {
	data, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(data)), 10, 64)
	return v, err == nil
}

func readKey(dir, file, key string) (uint64, bool) {
	f, err := os.Open(filepath.Join(dir, file))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseUint(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
