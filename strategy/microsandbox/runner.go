package microsandbox

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/api/session"
	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
	"github.com/agentconnect-md/agentconnect/internal/netpolicy"
	"github.com/agentconnect-md/agentconnect/internal/outputlog"
	"github.com/agentconnect-md/agentconnect/internal/protect"
	"github.com/agentconnect-md/agentconnect/internal/steps"
	"github.com/agentconnect-md/agentconnect/shim"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmnet"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmsnapshot"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

const (
	// bootTimeout bounds the wait for the guest agent to answer: TCG boots
	// in a few seconds, KVM in well under one.
	bootTimeout = 2 * time.Minute
	// vmCallTimeout bounds a call to the guest agent.
	vmCallTimeout = 30 * time.Second
	// poweroffTimeout bounds the wait for QEMU to exit after Shutdown.
	poweroffTimeout = 15 * time.Second
	// runtimeID names the runtime's process in the guest.
	runtimeID = "runtime"
)

// vmRun is the shim's side of one microsandbox run: the VM's devices on
// the host, its network, and the connection to its guest agent.
type vmRun struct {
	cfg     microvm.Config
	tools   microvm.Tools
	network *vmnet.Network
	netL    net.Listener
	// inject puts the run's secrets on the wire, for a run with secrets;
	// the guest trusts its CA.
	inject     *shim.Injector
	h          *shim.Host
	violations *shim.Violations
	// plan protects the writable shares; shares holds each share's binds
	// and checks until its virtiofsd has started.
	plan     *protect.Plan
	shares   []protect.RootPlan
	helpers  []int                       // virtiofsd's bwrap processes
	helperEx []<-chan syscall.WaitStatus // and their exits
	launcher int                         // init, then bwrap around QEMU: killing it ends the VM
	exited   <-chan struct{}             // closed at the launcher's exit
	status   syscall.WaitStatus          // the launcher's, once exited is closed
	copiers  sync.WaitGroup              // the runtime's output streams
	serial   *vmtransport.SerialClient
	dialer   vmtransport.Dialer
	client   *ttrpc.Client
	agent    vmagentv1.VMAgentService
	st       *steps.Steps // the start's, from Prepare on
	// With snapshots (microvm.Config.Snapshots): the guest's RAM, QEMU's
	// monitor, and where the VM's snapshot is kept.
	ram     *os.File
	monitor *monitor
	store   vmsnapshot.Store
	snapKey string
	// freshDisks: the VM's disks are new, no guest has run on them.
	freshDisks bool

	mu      sync.Mutex // guards qemuErr
	qemuErr strings.Builder
}

// Runner runs microsandbox sessions: a VM per run.
type Runner struct{}

// Start boots the session's VM (Prepare) and runs the runtime in it.
func (Runner) Start(h *shim.Host) (shim.Run, error) {
	vm, err := prepareOrBoot(h, false)
	if err != nil {
		return nil, err
	}
	return vm.start(h)
}

// Prepare boots the VM and sets its guest up from what the session shares
// with its agent (the image, the shares, the network policy, the size):
// a warm VM, whose guest agent waits for the runtime. Start binds the
// rest: the secrets (the injector on the VM's network, the session CA in
// the guest's trust store), the command and env.
func (Runner) Prepare(h *shim.Host) (shim.Prepared, error) {
	vm, err := prepareOrBoot(h, true)
	if err != nil {
		return nil, err
	}
	// Set up: from here on a claim's Stale reads what changed in the
	// shares.
	if err := vm.plan.Watch(); err != nil {
		h.Log().WithError(err).Info("the VM's shares are not watched: a claim scans them")
	}
	return vm, nil
}

// prepareOrBoot is prepare, from the VM's snapshot when it has one; a
// snapshot that does not restore is removed, and the VM boots.
func prepareOrBoot(h *shim.Host, settle bool) (*vmRun, error) {
	vm, err := prepare(h, settle, true, false)
	if r, ok := restoreError(err); ok {
		h.Log().WithError(err).Warn("the VM's snapshot did not restore; removed, booting instead")
		vm, err = prepare(h, settle, false, r.freshDisks)
	}
	return vm, err
}

// prepare boots the VM, or restores its snapshot (restore, when it has
// one), and sets its guest up; with settle, Setup answers once the guest is
// idle (a warm VM). freshDisks: the disks, if they exist, were made by a
// start in which no guest ran.
func prepare(h *shim.Host, settle, restore, freshDisks bool) (_ *vmRun, retErr error) {
	spec := h.Session().Spec
	vm := &vmRun{cfg: microvm.Config{VM: *spec.VM}, h: h, st: steps.New()}
	defer func() {
		if retErr != nil {
			vm.abort()
		}
	}()
	var err error
	if vm.tools, err = microvm.FindTools(); err != nil {
		return nil, shim.SandboxSetupError(err)
	}
	var snap *vmsnapshot.Snapshot
	if vm.cfg.Snapshots() {
		if snap, err = vm.openSnapshot(restore); err != nil {
			return nil, shim.SandboxSetupError(err)
		}
	}
	var kernel *os.File // a restore's stand-in (microvm.Config.KernelStub)
	if snap != nil {
		defer snap.Close()
		if kernel, err = kernelStub(vm.cfg); err != nil {
			return nil, shim.SandboxSetupError(err)
		}
		if kernel != nil {
			defer kernel.Close()
		}
	}
	// The disks are formatted (two mke2fs runs, ~20 ms each) and a
	// snapshot's RAM copied while the network and the shares' daemons
	// start; a return waits for them first, so that abort finds them done.
	var bg errgroup.Group
	bg.Go(func() (err error) {
		vm.freshDisks, err = microvm.PrepareDisks(vm.cfg, h.RunHelper)
		vm.freshDisks = vm.freshDisks || freshDisks
		return err
	})
	if snap != nil {
		bg.Go(func() error {
			if err := vmsnapshot.CopySparse(vm.ram, snap.RAM, int64(vm.cfg.MemoryMiB)<<20); err != nil {
				return errRestore{err: err}
			}
			return nil
		})
	}
	waited := false
	defer func() {
		if !waited {
			bg.Wait()
		}
	}()
	if err := os.MkdirAll(vm.cfg.RunDir, 0o700); err != nil {
		return nil, shim.SandboxSetupError(err)
	}
	if err := vm.startNetwork(); err != nil {
		return nil, shim.SandboxSetupError(err)
	}
	if err := vm.protectShares(); err != nil {
		return nil, shim.SandboxSetupError(err)
	}
	// Each virtiofsd takes ~17 ms to listen (bwrap's binds, its own
	// start): they start together, then the shim waits for all.
	for i := range vm.cfg.Shares {
		if err := vm.startVirtiofsd(i); err != nil {
			return nil, shim.SandboxSetupError(err)
		}
	}
	for i := range vm.cfg.Shares {
		if err := vm.virtiofsdListens(i); err != nil {
			return nil, shim.SandboxSetupError(err)
		}
	}
	vm.plan.CloseBinds()
	err, waited = bg.Wait(), true
	if r, ok := restoreError(err); ok {
		return nil, vm.restoreFailed(r.err)
	}
	if err != nil {
		return nil, shim.SandboxSetupError(err)
	}
	vm.st.Done("devices")

	// QEMU's stderr tells why it failed, when it does.
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	go vm.collectQEMUErrors(stderrR)
	consoleR, consoleW, err := os.Pipe()
	if err != nil {
		stderrW.Close()
		return nil, err
	}
	go h.CopyConsole(consoleR, filepath.Join(vm.cfg.Dir, "console.log"))
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		stderrW.Close()
		consoleW.Close()
		return nil, err
	}
	var launch microvm.Launch
	var extra []*os.File
	if vm.ram != nil {
		launch.RAMFD, launch.Incoming, extra = shim.ExtraFD, snap != nil, []*os.File{vm.ram}
		if kernel != nil {
			launch.KernelFD, extra = shim.ExtraFD+1, append(extra, kernel)
		}
	}
	argv := append([]string{vm.tools.Bwrap}, vm.cfg.ConfinedArgs(vm.tools.QEMU, launch)...)
	l, execErr, err := h.StartInCgroup(argv, vm.cfg.Dir, []string{"PATH=" + shim.LauncherPath},
		[3]*os.File{devnull, consoleW, stderrW}, extra, nil, nil)
	devnull.Close()
	stderrW.Close()
	consoleW.Close()
	if err != nil {
		return nil, shim.SandboxSetupError(err)
	}
	if execErr != "" {
		return nil, shim.SandboxSetupError(errors.New(execErr))
	}
	// The reaper delivers the exit once; every part of the run that waits
	// for it (the boot, a failed start, the run's end) waits for this.
	exited := make(chan struct{})
	go func() { vm.status = <-l.Exited; close(exited) }()
	vm.launcher, vm.exited = l.PID, exited
	vm.st.Done("qemu")
	agentStep := "boot"
	if vm.ram != nil {
		// Only a boot on new disks is saved: one on a resumed session's
		// would keep what the guest's kernel read of them.
		if err := vm.snapshotOrRestore(snap, vm.freshDisks, exited); err != nil {
			return nil, err
		}
		agentStep = "agent" // the boot, if any, is behind
	}
	if err := vm.connect(exited); err != nil {
		return nil, vm.withQEMUErrors(err)
	}
	vm.st.Done(agentStep)
	ctx, cancel := context.WithTimeout(context.Background(), vmCallTimeout)
	defer cancel()
	req, err := vm.setupRequest(settle)
	if err != nil {
		return nil, shim.SandboxSetupError(fmt.Errorf("guest setup: %w", err))
	}
	if _, err := vm.agent.Setup(ctx, req); err != nil {
		return nil, vm.withQEMUErrors(fmt.Errorf("guest setup: %w", err))
	}
	vm.st.Done("setup")
	return vm, nil
}

// Start is start for a VM booted ahead of its session (a warm VM the
// session claimed): its log says how long it waited.
func (vm *vmRun) Start(h *shim.Host) (shim.Run, error) {
	vm.st.Waited()
	// A repository made in a share since the VM was set up would be
	// writable from the guest: the caller builds the VM again.
	if stale, err := vm.plan.Stale(); err != nil {
		vm.abort()
		return nil, shim.SandboxSetupError(fmt.Errorf("check the protected names: %w", err))
	} else if stale {
		return nil, shim.ErrStaleBoundary
	}
	return vm.start(h)
}

// start binds what is the session's own (h's session as it is now, and
// its secrets) and starts the runtime in the guest.
func (vm *vmRun) start(h *shim.Host) (_ shim.Run, retErr error) {
	defer func() {
		if retErr != nil {
			vm.abort()
		}
	}()
	spec := h.Session().Spec
	ctx, cancel := context.WithTimeout(context.Background(), vmCallTimeout)
	defer cancel()
	env := spec.Env
	if len(h.Secrets()) > 0 {
		// Their connections go to agentconnect-inject, whose session CA
		// the guest trusts from now on: its runtime has not started.
		in, caPEM, err := h.StartInjector(spec.Sandbox.TrustedCAPEM)
		if err != nil {
			return nil, shim.SandboxSetupError(err)
		}
		vm.inject = in
		vm.network.SetInterceptor(in)
		if _, err := vm.agent.Trust(ctx, &vmagentv1.TrustRequest{SessionCaPem: string(caPEM)}); err != nil {
			return nil, vm.withQEMUErrors(fmt.Errorf("guest trust: %w", err))
		}
		env = session.MergeEnv(env, session.CAEnv())
	}
	vm.st.Done("bind")
	stdin, stdout, stderr, err := vm.openStdio(ctx)
	if err != nil {
		return nil, vm.withQEMUErrors(err)
	}
	vm.st.Done("stdio")
	if _, err := vm.agent.Exec(ctx, &vmagentv1.ExecRequest{Id: runtimeID, Args: spec.Command, Env: env, Cwd: spec.Workspace,
		Stdin: true, Stdout: true, Stderr: true, User: session.VMRuntimeUser, Uid: session.VMRuntimeUID}); err != nil {
		stdin.Close()
		stdout.Close()
		stderr.Close()
		return nil, vm.withQEMUErrors(fmt.Errorf("start the runtime in the guest: %w", err))
	}
	vm.st.Done("exec")
	vm.copiers.Add(2)
	go h.CopyOutput(stdout, outputlog.Stdout, &vm.copiers)
	go h.CopyOutput(stderr, outputlog.Stderr, &vm.copiers)
	h.Running(vm, vm.launcher, stdin, vm.st, logrus.Fields{"launcher": vm.launcher})
	return vm, nil
}

// Discard ends a VM that no session will run in.
func (vm *vmRun) Discard(h *shim.Host) { vm.abort() }

// abort ends a run whose runtime did not start: QEMU, if it runs, then the
// host side.
func (vm *vmRun) abort() {
	if vm.exited != nil {
		vm.killQEMU()
		<-vm.exited
	}
	vm.stop()
}

// withQEMUErrors is err as a sandbox setup error, with what QEMU said once
// it is gone (abort waits for that first).
func (vm *vmRun) withQEMUErrors(err error) error {
	if vm.exited != nil {
		vm.killQEMU()
		<-vm.exited
	}
	if msg := vm.qemuErrors(); msg != "" {
		err = fmt.Errorf("%w; qemu: %s", err, msg)
	}
	return shim.SandboxSetupError(err)
}

// Signal passes a signal to the runtime in the guest (all: every process
// the guest agent started). A SIGKILL the guest agent cannot deliver ends
// the VM from the host.
func (vm *vmRun) Signal(sig syscall.Signal, all bool) error {
	err := vm.signal(sig, all)
	if err != nil && sig == syscall.SIGKILL {
		vm.h.Log().WithError(err).Warn("SIGKILL: the guest agent did not answer; killing QEMU")
		vm.killQEMU()
		return nil
	}
	return err
}

// Wait follows the run to its end and releases its host side.
func (vm *vmRun) Wait() shim.Exit {
	state, code, reason := vm.wait(vm.exited, &vm.copiers)
	vm.h.CloseStdin()
	vm.stop()
	return shim.Exit{State: state, Code: code, Reason: reason}
}

// Release has nothing left to free: stop did, the VM being gone.
func (vm *vmRun) Release() {}

// DialInside connects to port on the guest's address through the VM's
// network, for a forward from the host's loopback.
func (vm *vmRun) DialInside(ctx context.Context, port int) (net.Conn, error) {
	return vm.network.DialGuest(ctx, port)
}

// startNetwork listens where QEMU's NIC connects and serves the VM's
// user-mode network, judged by the session's policy.
func (vm *vmRun) startNetwork() error {
	sb := vm.h.Session().Spec.Sandbox
	policy, err := netpolicy.New(sb.AllowedDomains, sb.DeniedDomains)
	if err != nil {
		return fmt.Errorf("network policy: %w", err)
	}
	vm.violations = vm.h.Violations()
	cfg := vmnet.Config{
		Policy:      policy,
		Resolver:    netpolicy.Resolver(sb.Resolver),
		OnViolation: vm.violations.Add,
		Logf:        vm.h.Log().Debugf,
	}
	vm.network, err = vmnet.New(cfg)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	os.Remove(vm.cfg.NetSocket())
	// Listen before QEMU starts: its stream netdev never reconnects.
	vm.netL, err = net.Listen("unix", vm.cfg.NetSocket())
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	go func() {
		c, err := vm.netL.Accept()
		if err != nil {
			return
		}
		vm.network.ServeQEMU(context.Background(), c)
	}()
	return nil
}

// protectShares opens every share by fd (the agent's directories beneath
// the agent directory, with no symlink followed) and protects the writable
// ones as srt protects its writable roots: their git directories and
// protected names are bound read-only in the view of the virtiofsd that
// serves them, where the guest cannot undo it.
func (vm *vmRun) protectShares() error {
	sb, shares := vm.h.Session().Spec.Sandbox, vm.cfg.Shares
	if sb == nil || len(shares) < 4 {
		return fmt.Errorf("session %s: the VM lacks the agent's directories", vm.h.Session().ID)
	}
	dirs, err := protect.OpenAgentDirs(sb.AgentDir, sb.SharedWorkspace, shares[0].Source, shares[1].Source, shares[2].Source, shares[3].Source)
	if err != nil {
		return err
	}
	var files []*os.File
	for _, d := range dirs {
		files = append(files, d.Dir)
	}
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	for _, sh := range shares[4:] {
		f, err := protect.OpenNoSymlinks(sh.Source)
		if err != nil {
			return fmt.Errorf("mount %s: %w", sh.Source, err)
		}
		files = append(files, f)
	}
	var roots []protect.Root
	for i, sh := range shares {
		if !sh.ReadOnly {
			roots = append(roots, protect.Root{Host: sh.Source, Dir: files[i], Target: microvm.ShareTarget,
				Workspace: i == 0, Home: i == 1})
		}
	}
	if vm.plan, err = protect.Prepare(protect.LedgerPath(sb.DaemonHome), roots); err != nil {
		return err
	}
	next := 0
	for i, sh := range shares {
		if !sh.ReadOnly {
			vm.shares = append(vm.shares, vm.plan.Roots[next])
			next++
			continue
		}
		rp, err := protect.ReadOnly(files[i], microvm.ShareTarget)
		if err != nil {
			return err
		}
		files[i] = nil // rp holds it; closed once its virtiofsd started
		vm.shares = append(vm.shares, rp)
	}
	return nil
}

// startVirtiofsd starts the daemon serving share i, confined in bwrap with
// the share bound from its fd (see microvm.Config.VirtiofsdLaunch);
// virtiofsdListens waits until it listens.
func (vm *vmRun) startVirtiofsd(i int) error {
	sh := vm.cfg.Shares[i]
	sock := vm.cfg.ShareSocket(i)
	os.Remove(sock)
	rp := vm.shares[i]
	defer func() {
		if sh.ReadOnly {
			rp.Binds[0].File.Close() // a writable share's binds are the plan's
		}
	}()
	checks, err := protect.ChecksFile(rp.Checks)
	if err != nil {
		return err
	}
	defer checks.Close()
	exe, err := os.OpenFile("/proc/self/exe", unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer exe.Close()
	// A root daemon mounts the protected names itself (protect.Premount):
	// bwrap then binds only the share, with them in it.
	binds := rp.Binds
	var premount func() error
	if len(binds) > 1 && protect.CanPremount() {
		roots := []protect.RootPlan{rp}
		premount = func() error { return protect.Premount(roots) }
		binds = binds[:1]
	}
	args, files := vm.cfg.VirtiofsdLaunch(vm.tools.Virtiofsd, i, exe, binds, checks)
	// What virtiofsd says goes to the shim's log, bounded: the guest's
	// requests are what it answers.
	msgR, msgW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("virtiofsd for %s: %w", sh.Source, err)
	}
	go vm.h.LogHelper(msgR, "virtiofsd", sh.Tag)
	// Its own user namespace, where the runtime user owns the share's root
	// (see microvm.ShareIDMap); bwrap starts in it as its root, with every
	// capability there and none outside.
	var st unix.Stat_t
	if err := unix.Fstat(int(rp.Binds[0].File.Fd()), &st); err != nil {
		msgW.Close()
		return fmt.Errorf("virtiofsd for %s: %w", sh.Source, err)
	}
	attr := &os.ProcAttr{Files: append([]*os.File{nil, msgW, msgW}, files...),
		Env: []string{"PATH=" + shim.LauncherPath},
		Sys: &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER,
			UidMappings:                microvm.ShareIDMap(session.VMRuntimeUID, st.Uid),
			GidMappings:                microvm.ShareIDMap(session.VMRuntimeUID, st.Gid),
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		}}
	pid, exited, err := vm.h.Spawn(vm.tools.Bwrap, append([]string{"bwrap"}, args...), attr, premount)
	msgW.Close()
	if err != nil {
		return fmt.Errorf("virtiofsd for %s: %w", sh.Source, err)
	}
	vm.helpers = append(vm.helpers, pid)
	vm.helperEx = append(vm.helperEx, exited)
	return nil
}

// virtiofsdListens waits until share i's virtiofsd listens on its socket,
// for 10 s at most.
func (vm *vmRun) virtiofsdListens(i int) error {
	sh, sock := vm.cfg.Shares[i], vm.cfg.ShareSocket(i)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		select {
		case <-vm.helperEx[i]:
			vm.helperEx[i] = nil // reaped: stop has nothing to wait for
			return fmt.Errorf("virtiofsd for %s exited before it listened (see shim.log)", sh.Source)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("virtiofsd for %s did not listen on %s (see shim.log)", sh.Source, sock)
		}
	}
}

// connect reaches the guest agent, retrying while the guest boots, until
// Health answers, QEMU exits, or bootTimeout passes.
func (vm *vmRun) connect(qemuExit <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	go func() {
		select {
		case <-qemuExit:
			cancel()
		case <-ctx.Done():
		}
	}()
	if vm.cfg.Transport == "vsock" {
		vm.dialer = vmtransport.VsockDialer{CID: vm.cfg.CID, Port: vmtransport.DefaultPort}
	} else {
		// Returns once the guest agent answered the hello: after boot.
		var err error
		if vm.serial, err = vmtransport.NewSerialClient(ctx, vm.cfg.AgentSocket()); err != nil {
			return fmt.Errorf("connect to the guest agent over the VM's serial port: %w", err)
		}
		vm.dialer = vm.serial
	}
	for {
		conn, err := vmtransport.DialWithRetry(ctx, vm.dialer, 100*time.Millisecond)
		if err != nil {
			return fmt.Errorf("the guest agent did not answer: %w", err)
		}
		if err := vmtransport.WritePreface(conn, vmtransport.KindTTRPC, ""); err != nil {
			conn.Close()
			continue
		}
		client := ttrpc.NewClient(conn)
		agent := vmagentv1.NewVMAgentClient(client)
		hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = agent.Health(hctx, &vmagentv1.HealthRequest{})
		hcancel()
		if err == nil {
			vm.client, vm.agent = client, agent
			return nil
		}
		client.Close()
		if ctx.Err() != nil {
			return fmt.Errorf("the guest agent did not answer: %w", err)
		}
	}
}

func (vm *vmRun) setupRequest(settle bool) (*vmagentv1.SetupRequest, error) {
	// A restored guest's random state and clock are its snapshot's.
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		return nil, err
	}
	req := &vmagentv1.SetupRequest{
		Entropy:      entropy,
		TimeUnixNano: time.Now().UnixNano(),
		Root:         &vmagentv1.Disk{Serial: microvm.DiskRoot, Readonly: true},
		Upper:        &vmagentv1.Disk{Serial: microvm.DiskUpper},
		Docker:       &vmagentv1.Disk{Serial: microvm.DiskDocker},
		Network:      &vmagentv1.Network{Address: vmnet.GuestIP + "/24", Gateway: vmnet.GatewayIP, Hostname: "agentconnect"},
		Settle:       settle,
	}
	for _, sh := range vm.cfg.Shares {
		req.Shares = append(req.Shares, &vmagentv1.Share{Tag: sh.Tag, Target: sh.Target, Readonly: sh.ReadOnly})
	}
	return req, nil
}

// openStdio opens the runtime's three stdio streams before Exec.
func (vm *vmRun) openStdio(ctx context.Context) (stdin, stdout, stderr net.Conn, err error) {
	var conns []net.Conn
	for _, kind := range []string{vmtransport.KindStdin, vmtransport.KindStdout, vmtransport.KindStderr} {
		c, err := vm.dialer.Dial(ctx)
		if err == nil {
			err = vmtransport.WritePreface(c, kind, runtimeID)
		}
		if err != nil {
			for _, o := range conns {
				o.Close()
			}
			return nil, nil, nil, fmt.Errorf("open the runtime's %s: %w", kind, err)
		}
		conns = append(conns, c)
	}
	return conns[0], conns[1], conns[2], nil
}

// wait follows the run to its end: the runtime's exit reported by the
// guest agent, then a clean power-off; or QEMU dying under it, which loses
// the session.
func (vm *vmRun) wait(qemuExit <-chan struct{}, copiers *sync.WaitGroup) (state string, code int, reason string) {
	type result struct {
		resp *vmagentv1.WaitResponse
		err  error
	}
	waited := make(chan result, 1)
	go func() {
		resp, err := vm.agent.Wait(context.Background(), &vmagentv1.WaitRequest{Id: runtimeID})
		waited <- result{resp, err}
	}()
	select {
	case r := <-waited:
		if r.err == nil {
			// The output's streams end when the guest agent closes
			// them; a guest process still holding them is cut off by
			// the power-off.
			shim.WaitTimeout(copiers, shim.DrainTimeout)
			ctx, cancel := context.WithTimeout(context.Background(), vmCallTimeout)
			vm.agent.Shutdown(ctx, &vmagentv1.ShutdownRequest{})
			cancel()
			select {
			case <-qemuExit:
			case <-time.After(poweroffTimeout):
				vm.killQEMU()
				<-qemuExit
			}
			return session.Exited, int(r.resp.ExitCode), r.resp.Reason
		}
		<-qemuExit
		return session.Lost, -1, vm.deathReason(vm.status)
	case <-qemuExit:
		return session.Lost, -1, vm.deathReason(vm.status)
	}
}

// deathReason says how QEMU ended, when it ended before the runtime.
func (vm *vmRun) deathReason(ws syscall.WaitStatus) string {
	how := fmt.Sprintf("exited with status %d", ws.ExitStatus())
	if ws.Signaled() {
		how = fmt.Sprintf("was killed by signal %d (%s)", int(ws.Signal()), unix.SignalName(ws.Signal()))
	}
	reason := "the VM stopped before its runtime: QEMU " + how
	if msg := vm.qemuErrors(); msg != "" {
		reason += ": " + msg
	}
	return reason
}

func (vm *vmRun) collectQEMUErrors(r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(io.LimitReader(r, 64<<10))
	for sc.Scan() {
		vm.mu.Lock()
		if vm.qemuErr.Len() < 2048 {
			vm.qemuErr.WriteString(strings.TrimSpace(sc.Text()) + "; ")
		}
		vm.mu.Unlock()
	}
}

func (vm *vmRun) qemuErrors() string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return strings.TrimSuffix(vm.qemuErr.String(), "; ")
}

// signal passes a signal to the runtime in the guest (all: every process
// the guest agent started).
func (vm *vmRun) signal(sig syscall.Signal, all bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), vmCallTimeout)
	defer cancel()
	_, err := vm.agent.Signal(ctx, &vmagentv1.SignalRequest{Id: runtimeID, Signal: uint32(sig), All: all})
	return err
}

// killQEMU ends the VM at once, from the host: bwrap takes QEMU with it.
func (vm *vmRun) killQEMU() {
	vm.h.Signal(vm.launcher, syscall.SIGKILL)
}

// stop releases the run's host side: the agent connection, the network,
// virtiofsd, the sockets. The disks stay, for a resume.
func (vm *vmRun) stop() {
	if vm.client != nil {
		vm.client.Close()
	}
	if vm.monitor != nil {
		vm.monitor.close()
	}
	if vm.ram != nil {
		vm.ram.Close()
	}
	if vm.serial != nil {
		vm.serial.Close()
	}
	if vm.netL != nil {
		vm.netL.Close()
	}
	if vm.network != nil {
		vm.network.Close()
	}
	if vm.inject != nil {
		vm.inject.Stop()
	}
	for _, p := range vm.helpers {
		vm.h.Signal(p, syscall.SIGKILL)
	}
	for _, ex := range vm.helperEx {
		if ex == nil {
			continue
		}
		select {
		case <-ex:
		case <-time.After(shim.KillTimeout):
		}
	}
	for _, rp := range vm.shares {
		if len(rp.Binds) == 1 && rp.Binds[0].ReadOnly {
			rp.Binds[0].File.Close() // a read-only share's, if its virtiofsd never started
		}
	}
	if vm.plan != nil {
		// The guest and virtiofsd are gone: what the run left in
		// repositories it created is final, and the placeholders may go.
		if vm.violations != nil {
			for _, f := range vm.plan.Audit() {
				vm.violations.AddFile(f.Path, f.Reason)
			}
		}
		vm.plan.Release()
	}
	if vm.violations != nil {
		vm.violations.Close()
	}
	os.RemoveAll(vm.cfg.RunDir)
}
