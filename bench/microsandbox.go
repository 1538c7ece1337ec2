package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

// vmConfig is the bench daemon's config.json: microsandbox VMs under TCG
// with the serial transport, which need neither /dev/kvm nor vsock, so that
// the numbers are those of any machine (and of CI). The memory agents
// override memoryMiB.
const vmConfig = `{"sandbox":{"microsandbox":{"accelerator":"tcg","transport":"serial","cpus":1,"memoryMiB":512}}}` + "\n"

const (
	// vmAgent is the agent of the start measurement: the daemon's VM
	// settings, a runtime that prints one line.
	vmAgent = "bench-vm"
	// vmWarmup starts are not counted: the first boots (it reads the image
	// from disk, and saves the snapshot the others restore).
	vmWarmup = 1
	// vmColdGoal is the goal of a cold start to its first output byte under
	// TCG (issue 11), from a restored snapshot.
	vmColdGoal = 1500
	// vmIdle is how long a VM session runs before its memory is read: the
	// guest settles after its agent answers.
	vmIdle = 5 * time.Second
	// vmGoneGrace is how long a removed VM session's processes and files
	// get to go: QEMU is stopped and the shim exits after the removal.
	vmGoneGrace = 10 * time.Second
)

var vmEchoCommand = []string{"/bin/echo", "hi"}

// vmMemAgent is the agent whose VMs have mib MiB of memory.
func vmMemAgent(mib int) string { return fmt.Sprintf("bench-vm-%d", mib) }

// createVMAgents creates the microsandbox agents when the daemon can run
// VMs here. It returns why the microsandbox measurements cannot run, or "".
func (d *daemon) createVMAgents(ctx context.Context, c counts) string {
	a, err := d.dialAdmin()
	if err != nil {
		return err.Error()
	}
	defer a.Close()
	if why := strategyUnavailable(ctx, a, "microsandbox"); why != "" {
		return why
	}
	agents := []*adminv1.Agent{{Name: vmAgent, Strategy: "microsandbox", Command: vmEchoCommand}}
	for _, mib := range c.VMMemoryMiB {
		agents = append(agents, &adminv1.Agent{Name: vmMemAgent(mib), Strategy: "microsandbox", Command: sleepCommand,
			Resources: &adminv1.Resources{MemoryMib: uint32(mib)}})
	}
	for _, agent := range agents {
		if _, err := a.CreateAgent(ctx, &adminv1.CreateAgentRequest{Agent: agent}); err != nil {
			return "create the microsandbox agent " + agent.Name + ": " + err.Error()
		}
	}
	return ""
}

// benchVMStart times microsandbox starts of /bin/echo hi, one after the
// other: StartSession to the first output byte, and from the shim's log the
// boot to the guest agent's answer and the guest's setup. Each session is
// waited for, removed and checked for leftovers.
func benchVMStart(ctx context.Context, d *daemon, c counts, rep *report) error {
	const m = "microsandbox start (TCG, serial, 1 CPU, 512 MiB)"
	if d.vmUnavailable != "" {
		rep.note(m, "boot to vmagent ready", "unavailable: "+d.vmUnavailable)
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	var ready, setup, first, rest, restore samples
	var boot vmStart
	restored := 0
	for i := 0; i < vmWarmup+c.VMStarts; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := vmStartOnce(ctx, d, a)
		if err != nil {
			return fmt.Errorf("start %d: %w", i+1, err)
		}
		if i == 0 {
			boot = r
		}
		if i >= vmWarmup {
			ready.add(r.ready)
			setup.add(r.setup)
			first.add(r.first)
			rest.add(r.first - r.ready - r.setup)
			if r.restored {
				restored++
				restore.add(r.restore)
			}
		}
	}
	const goal = "measured (TCG)"
	n := fmt.Sprintf("n=%d after %d warm-up start; ", len(first), vmWarmup)
	rep.add(m, "first start (boots, saves the snapshot) -> first output byte", float64(boot.first.Microseconds())/1000, "ms", 0,
		fmt.Sprintf("the warm-up start; shim log: boot %v, save %v", boot.boot.Round(time.Millisecond), boot.save.Round(time.Millisecond)))
	rep.note(m, "starts restored from the snapshot", fmt.Sprintf("%d of %d counted; the rest booted", restored, len(first)))
	if restored > 0 {
		rep.add(m, "restore p50", restore.median(), "ms", 0, "shim log: restore (QEMU's device state in, the RAM copied beforehand in devices)")
	}
	rep.addGoal(m, "boot to vmagent ready p50", ready.median(), "ms", goal, n+"shim log: devices + qemu + restore or boot + shares + the guest agent's answer to Health")
	rep.add(m, "boot to vmagent ready min", ready.min(), "ms", 0, "")
	rep.add(m, "boot to vmagent ready max", ready.max(), "ms", 0, "")
	rep.add(m, "guest setup p50", setup.median(), "ms", 0, "shim log: setup (the guest agent's Setup call)")
	rep.add(m, "start -> first output byte p50", first.median(), "ms", vmColdGoal, "admin API StartSession to the first Attach chunk; /bin/echo hi; a cold start (no warm VM), restored from the snapshot")
	rep.add(m, "start -> first output byte min", first.min(), "ms", 0, "")
	rep.add(m, "start -> first output byte max", first.max(), "ms", 0, "")
	rep.add(m, "first byte - ready - setup p50", rest.median(), "ms", 0, "neither boot nor setup: the daemon, the shim, the exec in the guest, the output's way out")
	return nil
}

type vmStart struct {
	ready, setup, first time.Duration
	restored            bool
	restore, boot, save time.Duration
}

// vmStartOnce is one start of the echo agent timed to its first output
// byte, with the steps of its shim's log; then the session is waited for,
// removed and checked for leftovers (not timed).
func vmStartOnce(ctx context.Context, d *daemon, a *admin) (r vmStart, err error) {
	first, s, err := firstByte(ctx, a, vmAgent)
	if s != nil {
		defer func() {
			if endErr := endVMSession(ctx, d, a, s.Id, false); endErr != nil && err == nil {
				err = endErr
			}
		}()
	}
	if err != nil {
		return r, err
	}
	steps, err := runtimeSteps(d, s.Id)
	if err != nil {
		return r, err
	}
	for _, name := range []string{"devices", "qemu", "setup"} {
		if _, ok := steps[name]; !ok {
			return r, fmt.Errorf("session %s: no %q in the steps of its shim log's \"runtime started\" line", s.Id, name)
		}
	}
	r = vmStart{setup: steps["setup"], first: first, boot: steps["boot"], save: steps["save"]}
	r.restore, r.restored = steps["restore"]
	// Everything before setup: a boot, or a restore with its shares.
	for _, name := range []string{"devices", "qemu", "restore", "boot", "save", "shares", "agent"} {
		r.ready += steps[name]
	}
	return r, nil
}

// runtimeSteps reads the steps of the "runtime started" line of a
// session's shim log ("devices 59.04ms, qemu 17.53ms, boot 2.57136s, ...").
// The shim logs it before the start returns; the wait allows for the
// write reaching the file late.
func runtimeSteps(d *daemon, id string) (map[string]time.Duration, error) {
	path := filepath.Join(home.Layout{Root: d.home}.SessionDir(id), "shim.log")
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		line := ""
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var entry struct {
				Msg   string `json:"msg"`
				Steps string `json:"steps"`
			}
			if json.Unmarshal(sc.Bytes(), &entry) == nil && entry.Msg == "runtime started" {
				line = entry.Steps
			}
		}
		f.Close()
		if line != "" {
			steps := map[string]time.Duration{}
			for _, step := range strings.Split(line, ", ") {
				name, v, _ := strings.Cut(step, " ")
				dur, err := time.ParseDuration(v)
				if err != nil {
					return nil, fmt.Errorf("%s: steps %q: %v", path, line, err)
				}
				steps[name] = dur
			}
			return steps, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s has no \"runtime started\" line with steps", path)
		}
	}
}

// benchVMMemory starts one idle VM session (sleep 600) at each memoryMiB
// in turn and sums what it costs the host: QEMU, the virtiofsd processes of
// its shares and its shim, by PSS from /proc/PID/smaps_rollup (RSS would
// count the libraries they share, and the guest's RAM that virtiofsd maps,
// once per process). Each session is stopped, removed and checked for
// leftovers.
func benchVMMemory(ctx context.Context, d *daemon, c counts, rep *report) error {
	m := fmt.Sprintf("microsandbox session memory (sleep 600, after %d s)", int(vmIdle.Seconds()))
	if d.vmUnavailable != "" {
		rep.note(m, "QEMU+virtiofsd+shim PSS", "unavailable: "+d.vmUnavailable)
		return nil
	}
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	const kib = 1024.0
	var bwrap samples
	for _, mib := range c.VMMemoryMiB {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		u, err := vmMemoryOnce(ctx, d, a, mib)
		if err != nil {
			return fmt.Errorf("memoryMiB %d: %w", mib, err)
		}
		total := u.qemu.add(u.virtiofsd).add(u.shim)
		rep.addGoal(m, fmt.Sprintf("memoryMiB %d: PSS", mib), float64(total.pss)/kib, "MiB", "QEMU+virtiofsd+shim",
			fmt.Sprintf("QEMU %.1f (guest RAM held %.1f, QEMU's own %.1f), virtiofsd x%d %.1f, shim %.1f MiB",
				float64(u.qemu.pss)/kib, float64(u.guestRAM)/kib, float64(u.qemu.pss-u.guestRAM)/kib,
				u.nVirtiofsd, float64(u.virtiofsd.pss)/kib, float64(u.shim.pss)/kib))
		rep.add(m, fmt.Sprintf("memoryMiB %d: RSS", mib), float64(total.rss)/kib, "MiB", 0, "the same processes; shared pages counted in each")
		bwrap = append(bwrap, float64(u.bwrap.pss))
	}
	rep.add(m, "bwrap around QEMU PSS mean", bwrap.mean()/kib, "MiB", 0, "not summed above: the confinement's own process, one per VM")
	return nil
}

// memUse is memory in kB.
type memUse struct{ rss, pss int64 }

func (u memUse) add(v memUse) memUse { return memUse{u.rss + v.rss, u.pss + v.pss} }

type vmMemory struct {
	qemu, virtiofsd, shim, bwrap memUse
	nVirtiofsd                   int
	// guestRAM is what the guest's RAM (a memfd) holds, in KiB: every
	// page the guest touched or a restore copied in.
	guestRAM int64
}

// vmMemoryOnce starts a session of the memoryMiB agent, lets it idle and
// reads its processes' memory: QEMU by its VM directory, virtiofsd by its
// socket, the bwraps around them by either, the shim by the session's pid.
func vmMemoryOnce(ctx context.Context, d *daemon, a *admin, mib int) (u vmMemory, err error) {
	agent := vmMemAgent(mib)
	s, err := a.StartSession(ctx, &adminv1.StartSessionRequest{Agent: agent})
	if err != nil {
		return u, fmt.Errorf("start session: %w", err)
	}
	id := s.Id
	defer func() {
		if endErr := endVMSession(ctx, d, a, id, true); endErr != nil && err == nil {
			err = endErr
		}
	}()
	select {
	case <-time.After(vmIdle):
	case <-ctx.Done():
		return u, ctx.Err()
	}
	s, err = a.GetSession(ctx, &adminv1.GetSessionRequest{Id: id})
	if err != nil {
		return u, err
	}
	if s.State != "running" || s.ShimPid == 0 {
		return u, fmt.Errorf("session %s: state %q, shim pid %d (%s); want a running session with a shim", s.Id, s.State, s.ShimPid, s.Reason)
	}
	vmDir := filepath.Join(home.Layout{Root: d.home}.VMsDir(), s.Id) + "/"
	// virtiofsd serves a share bound into its own view: it is found by its
	// socket, in the run's socket directory (one VM runs at a time here).
	runDirs, _ := filepath.Glob(filepath.Join(home.Layout{Root: d.home}.FindSocketDir(), "*.vm"))
	if len(runDirs) != 1 {
		return u, fmt.Errorf("session %s: %d VM socket directories, want 1", s.Id, len(runDirs))
	}
	source := "--socket-path=" + runDirs[0] + "/fs"
	var qemus []*leftovers.Proc
	for _, p := range leftovers.ReadProcs() {
		if p.Dead() {
			continue
		}
		var into *memUse
		switch {
		case p.PID == int(s.ShimPid):
			into = &u.shim
		case isQEMU(p) && strings.Contains(p.Cmdline, vmDir):
			into = &u.qemu
			qemus = append(qemus, p)
		case isVirtiofsd(p) && strings.Contains(p.Cmdline, source):
			into = &u.virtiofsd
			u.nVirtiofsd++
		case p.Name() == "bwrap" && (strings.Contains(p.Cmdline, vmDir) || strings.Contains(p.Cmdline, runDirs[0]+" ")):
			into = &u.bwrap
		default:
			continue
		}
		roll, err := readSmapsRollup(p.PID)
		if err != nil {
			return u, fmt.Errorf("%v: %w", p, err)
		}
		use := memUse{roll["Rss"], roll["Pss"]}
		if isQEMU(p) {
			// The guest's RAM is a memfd: what QEMU has mapped of it is in
			// its PSS, but a restored VM's memfd holds the snapshot's pages
			// whether the guest touched them or not. Count all it holds.
			held := ramHeld(p.PID)
			u.guestRAM += max(held, roll["Pss_Shmem"])
			extra := max(0, held-roll["Pss_Shmem"])
			use = use.add(memUse{extra, extra})
		}
		*into = into.add(use)
	}
	switch {
	case len(qemus) != 1:
		return u, fmt.Errorf("session %s: %d QEMU processes with %s in their command line, want 1", s.Id, len(qemus), vmDir)
	case !strings.Contains(qemus[0].Cmdline, fmt.Sprintf(" -m %d ", mib)):
		// The agent's memoryMiB must be what the VM got.
		return u, fmt.Errorf("session %s: QEMU runs without -m %d: %s", s.Id, mib, qemus[0])
	case u.nVirtiofsd == 0:
		return u, fmt.Errorf("session %s: no virtiofsd process with %s in its command line", s.Id, source)
	case u.shim.pss == 0:
		return u, fmt.Errorf("session %s: no shim process %d", s.Id, s.ShimPid)
	}
	return u, nil
}

// isQEMU and isVirtiofsd go by comm: virtiofsd's sandboxed child has
// pivoted into the shared directory, where its executable is not.
func isQEMU(p *leftovers.Proc) bool      { return strings.HasPrefix(p.Comm, "qemu-system") }
func isVirtiofsd(p *leftovers.Proc) bool { return p.Comm == "virtiofsd" }

// endVMSession ends a VM session (StopSession when stop, else it must exit
// 0 by itself), removes it, and waits until it has left nothing behind.
func endVMSession(ctx context.Context, d *daemon, a *admin, id string, stop bool) error {
	// Cleanup goes on after an interrupt.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	defer cancel()
	var problems []string
	if stop {
		if _, err := a.StopSession(ctx, &adminv1.StopSessionRequest{Id: id}); err != nil {
			problems = append(problems, "stop: "+err.Error())
		}
	}
	var shimPID uint32
	end, err := a.WaitSession(ctx, &adminv1.WaitSessionRequest{Id: id})
	switch {
	case err != nil:
		problems = append(problems, "wait: "+err.Error())
	case end.State != "exited" || (!stop && end.ExitCode != 0):
		problems = append(problems, fmt.Sprintf("ended %s, exit code %d: %s", end.State, end.ExitCode, end.Reason))
	}
	if end != nil {
		shimPID = end.ShimPid
	}
	if _, err := a.RemoveSession(ctx, &adminv1.RemoveSessionRequest{Id: id, Force: true}); err != nil {
		problems = append(problems, "remove: "+err.Error())
	} else {
		var left []string
		for deadline := time.Now().Add(vmGoneGrace); ; time.Sleep(50 * time.Millisecond) {
			if left = vmLeftBehind(d, id, shimPID); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			problems = append(problems, fmt.Sprintf("left behind %v after removal: %s", vmGoneGrace, leftovers.Brief(left, 6)))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("session %s: %s", id, strings.Join(problems, "; "))
	}
	return nil
}

// vmLeftBehind lists what a removed VM session left: its VM directory, the
// VMs' socket directories of the home, any QEMU or virtiofsd process of
// the home or process naming its VM directory, and its shim.
func vmLeftBehind(d *daemon, id string, shimPID uint32) []string {
	layout := home.Layout{Root: d.home}
	vmDir := filepath.Join(layout.VMsDir(), id)
	var left []string
	if _, err := os.Stat(vmDir); !errors.Is(err, os.ErrNotExist) {
		left = append(left, "its VM directory "+vmDir)
	}
	runDirs, _ := filepath.Glob(filepath.Join(layout.FindSocketDir(), "*.vm"))
	for _, dir := range runDirs {
		left = append(left, "a VM socket directory "+dir)
	}
	for _, p := range leftovers.ReadProcs() {
		if p.Dead() {
			continue
		}
		ofHome := (isQEMU(p) || isVirtiofsd(p)) && strings.Contains(p.Cmdline, d.home)
		shim := p.PID == int(shimPID) && strings.Contains(p.Cmdline, id)
		if ofHome || shim || strings.Contains(p.Cmdline, vmDir+"/") {
			left = append(left, p.String())
		}
	}
	sort.Strings(left)
	return left
}

// benchImage reports the default guest image: its root's size (the disk
// blocks it uses, and its apparent size) and how long the make image run
// that wrote it took, with what that run built (a run from cache builds
// little).
func benchImage(_ context.Context, d *daemon, _ counts, rep *report) error {
	const m = "default guest image (make image)"
	dir := filepath.Join(d.bin, "image")
	data, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		rep.note(m, "rootfs used", "unavailable: no image in "+dir+" (make image builds it)")
		return nil
	}
	var manifest struct {
		BuildSeconds *float64          `json:"buildSeconds"`
		Rebuilt      string            `json:"rebuilt"`
		Runtimes     map[string]string `json:"runtimes"`
	}
	if err := json.Unmarshal(data, &manifest); err != nil {
		return fmt.Errorf("%s/image.json: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "rootfs.img"), &st); err != nil {
		return err
	}
	rep.add(m, "rootfs used", float64(st.Blocks*512)/(1<<20), "MiB", 0, fmt.Sprintf("ext4, sparse; %d runtimes, Docker Engine with Buildx and Compose", len(manifest.Runtimes)))
	rep.add(m, "rootfs apparent size", float64(st.Size)/(1<<20), "MiB", 0, "")
	if manifest.BuildSeconds != nil {
		built := manifest.Rebuilt
		if built == "" {
			built = "nothing: all from cache"
		}
		rep.add(m, "build time of its make image run", *manifest.BuildSeconds*1000, "ms", 0, "that run built: "+built)
	}
	return nil
}

// ramHeld is what the guest RAM memfds QEMU process pid has open hold, in
// KiB (their allocated blocks), whether mapped by QEMU or not.
func ramHeld(pid int) int64 {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	var held int64
	seen := map[uint64]bool{} // QEMU has the memfd it was given, and its own open of it
	for _, fd := range fds {
		path := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
		if target, _ := os.Readlink(path); !strings.HasPrefix(target, "/memfd:agentconnect-vm-ram") {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && !seen[st.Ino] {
			seen[st.Ino] = true
			held += st.Blocks / 2
		}
	}
	return held
}
