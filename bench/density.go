package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

const (
	// vmDensityBudget is the host memory the density measurement fills
	// with idle VMs.
	vmDensityBudget = 20 << 30
	// vmDensityReserve is the MemAvailable it never goes under, whatever
	// the budget: the machine has other work.
	vmDensityReserve = 2 << 30
	// vmDensityWidth VMs boot at once (each boot takes a core under TCG).
	vmDensityWidth = 2
)

// benchVMDensity starts idle VM sessions (sleep 600 at memoryMiB 512), a
// few at a time, until the host's available memory has dropped by
// vmDensityBudget (or is down to vmDensityReserve), a start fails, or
// c.VMDensity run; then checks that every one still runs and reads what
// they cost by PSS, stops and removes them all, and checks that nothing is
// left behind.
func benchVMDensity(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m = "idle microsandbox VMs in 20 GiB (sleep 600, 512 MiB, TCG)"
	if d.vmUnavailable != "" {
		rep.note(m, "VMs running", "unavailable: "+d.vmUnavailable)
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	avail0, err := memAvailable()
	if err != nil {
		return err
	}
	var started []*adminv1.Session
	ended := false
	defer func() {
		if !ended { // an error or an interrupt: they go all the same
			endVMSessions(ctx, d, a, started)
		}
	}()
	t0 := time.Now()
	stopped := fmt.Sprintf("the cap of %d VMs", c.VMDensity)
	for len(started) < c.VMDensity && ctx.Err() == nil {
		avail, err := memAvailable()
		if err != nil {
			return err
		}
		if avail0-avail >= vmDensityBudget || avail <= vmDensityReserve {
			stopped = fmt.Sprintf("the budget: %.1f GiB used, %.1f GiB available", gib(avail0-avail), gib(avail))
			break
		}
		batch := make([]*adminv1.Session, min(vmDensityWidth, c.VMDensity-len(started)))
		errs := make([]error, len(batch))
		parallel(len(batch), len(batch), func(i int) {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			defer cancel()
			batch[i], errs[i] = a.StartSession(sctx, &adminv1.StartSessionRequest{Agent: vmMemAgent(512)})
		})
		for _, s := range batch {
			if s != nil {
				started = append(started, s)
			}
		}
		if failed := countErrors(errs); len(failed) > 0 {
			stopped = "a failed start: " + leftovers.Brief(failed, 2)
			break
		}
	}
	startTook := time.Since(t0)
	select {
	case <-time.After(vmIdle):
	case <-ctx.Done():
		return ctx.Err()
	}
	avail, err := memAvailable()
	if err != nil {
		return err
	}
	list, err := a.ListSessions(ctx, &adminv1.ListSessionsRequest{Agent: vmMemAgent(512)})
	if err != nil {
		return err
	}
	procs := leftovers.ReadProcs()
	children := leftovers.ChildrenOf(procs)
	running, pss := 0, int64(0)
	for _, s := range list.Sessions {
		if s.State != "running" || s.ShimPid == 0 {
			continue
		}
		running++
		for _, pid := range append([]int{int(s.ShimPid)}, leftovers.Descendants(children, int(s.ShimPid))...) {
			if roll, err := readSmapsRollup(pid); err == nil {
				pss += roll["Pss"] << 10
				if p := procs[pid]; p != nil && isQEMU(p) {
					// The guest RAM memfd's pages QEMU has not mapped.
					pss += max(0, ramHeld(pid)-roll["Pss_Shmem"]) << 10
				}
			}
		}
	}
	n := len(started)
	rep.add(m, "VMs running", float64(running), "VMs", 0, fmt.Sprintf("%d started in %.0f s, %d at a time; stopped at %s", n, startTook.Seconds(), vmDensityWidth, stopped))
	if running != n {
		rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %d of %d started VMs running after %v", m, running, n, vmIdle))
	}
	if n > 0 {
		rep.add(m, "host memory used per VM", gib(avail0-avail)*1024/float64(n), "MiB", 0, fmt.Sprintf("MemAvailable %.1f -> %.1f GiB", gib(avail0), gib(avail)))
		rep.add(m, "PSS per VM", gib(pss)*1024/float64(max(running, 1)), "MiB", 0, "the shim and everything under it: QEMU (with all its guest RAM memfd holds), virtiofsd, bwrap")
	}
	ended = true
	t1 := time.Now()
	left := endVMSessions(ctx, d, a, started)
	rep.add(m, "stop and remove all", ms(time.Since(t1)), "ms", 0, "StopSession, then RemoveSession, 8 at a time")
	if len(left) == 0 {
		rep.note(m, "nothing left behind", "yes; checked: processes of ours, VM and socket directories, session cgroups, mounts under the home")
	} else {
		rep.note(m, "nothing left behind", "NO: "+strings.Join(left, "; "))
		rep.Errors = append(rep.Errors, m+": left behind: "+strings.Join(left, "; "))
	}
	return nil
}

// endVMSessions stops and removes sessions, 8 at a time, and returns what
// they left behind once all are gone (after vmGoneGrace at most): what any
// session may leave (sessionsLeftBehind), VM directories, VM socket
// directories.
func endVMSessions(ctx context.Context, d *daemon, a *admin, sessions []*adminv1.Session) []string {
	// Cleanup goes on after an interrupt.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	var problems []string
	errs := make([]error, len(sessions))
	parallel(len(sessions), 8, func(i int) {
		if _, err := a.StopSession(ctx, &adminv1.StopSessionRequest{Id: sessions[i].Id, TimeoutSeconds: 30}); err != nil {
			errs[i] = err
			return
		}
		if _, err := a.WaitSession(ctx, &adminv1.WaitSessionRequest{Id: sessions[i].Id}); err != nil {
			errs[i] = err
			return
		}
		_, errs[i] = a.RemoveSession(ctx, &adminv1.RemoveSessionRequest{Id: sessions[i].Id, Force: true})
	})
	if failed := countErrors(errs); len(failed) > 0 {
		problems = append(problems, "stop, wait, remove: "+leftovers.Brief(failed, 3))
	}
	var roots []string
	ids := map[string]bool{}
	for _, s := range sessions {
		ids[s.Id] = true
	}
	if len(sessions) > 0 {
		roots = leftovers.CgroupRoots(sessions[0].Cgroup)
	}
	layout := home.Layout{Root: d.home}
	for deadline := time.Now().Add(vmGoneGrace); ; time.Sleep(100 * time.Millisecond) {
		left := sessionsLeftBehind(d, roots, ids)
		if vms, _ := os.ReadDir(layout.VMsDir()); len(vms) > 0 {
			left = append(left, fmt.Sprintf("%d VM directories in %s", len(vms), layout.VMsDir()))
		}
		if runDirs, _ := filepath.Glob(filepath.Join(layout.FindSocketDir(), "*.vm")); len(runDirs) > 0 {
			left = append(left, fmt.Sprintf("%d VM socket directories: %s", len(runDirs), leftovers.Brief(runDirs, 2)))
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return append(problems, left...)
		}
	}
}

// memAvailable is the host's MemAvailable in bytes.
func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/meminfo has no MemAvailable")
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }
