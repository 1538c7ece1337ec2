package vmagent

import (
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// warmTools are programs the runtimes' own sandboxes start with a deadline:
// Claude Code gives its two socat bridges about 600 ms to listen, and
// under TCG a first socat (libssl and libcrypto read from the image's
// disk and linked) takes 800 to 1000 ms, a second one about 400 ms.
var warmTools = [][]string{{"/usr/bin/socat", "-V"}, {"/usr/bin/bwrap", "--version"}}

// settleWait bounds how long a settling Setup waits for the warm tools.
const settleWait = 10 * time.Second

// warm runs each of warmTools once, in the background, so that the page
// cache and the dynamic linker have them when a runtime needs them fast.
// They run in the idle scheduling class: the session's runtime, started
// right after Setup on a cold start, never waits for them (under TCG they
// are about a second of the one vCPU). PID 1's reaper reaps them. An image
// without one skips it. With settle it returns once they are gone (at most
// settleWait): a warm VM's claim then finds the guest idle.
func warm(logf func(string, ...any), settle bool) {
	started := startWarmTools(logf)
	if settle {
		waitReaped(<-started, settleWait)
	}
}

// startWarmTools starts each of warmTools that the image has, from a
// thread of the idle class, whose children inherit it (their fork and
// exec are idle too); the channel gets their pids.
func startWarmTools(logf func(string, ...any)) <-chan []int {
	started := make(chan []int, 1)
	go func() {
		// The goroutine ends locked to its thread, so the thread ends
		// with it and nothing else ever runs there.
		runtime.LockOSThread()
		idle := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}
		if err := unix.SchedSetAttr(0, &idle, 0); err != nil {
			logf("warm: idle scheduling class: %v", err)
		}
		started <- spawnTools(logf)
	}()
	return started
}

func spawnTools(logf func(string, ...any)) []int {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		logf("warm: %v", err)
		return nil
	}
	defer null.Close()
	var pids []int
	for _, argv := range warmTools {
		if _, err := os.Stat(argv[0]); err != nil {
			continue
		}
		p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Dir: "/", Env: []string{}, Files: []*os.File{null, null, null},
			Sys: &syscall.SysProcAttr{Setsid: true}})
		if err != nil {
			logf("warm: %s: %v", argv[0], err)
			continue
		}
		pids = append(pids, p.Pid)
		p.Release()
	}
	return pids
}

// waitReaped waits until the processes pids are reaped (by PID 1's
// reaper, not by this), at most wait.
func waitReaped(pids []int, wait time.Duration) {
	deadline := time.Now().Add(wait)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) != syscall.ESRCH && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
}
