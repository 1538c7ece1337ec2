package microsandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmsnapshot"
)

// A VM with snapshots (microvm.Config.Snapshots) runs in the layout that can
// be saved and restored. Its RAM is a memfd the shim makes and QEMU maps
// (shared: the migration leaves it out, x-ignore-shared), QEMU has a QMP
// monitor, and the shares are plugged in once QEMU runs (QEMU 7.2 cannot
// migrate vhost-user-fs). The first boot of a snapshot key saves itself as
// soon as the guest agent opens its serial port, before the host has said a
// word to it; later starts restore that instead of booting. The guest agent
// cannot tell one from the other: Setup gives it the host's entropy and time
// either way.

// snapshotTimeout bounds saving a snapshot (a restore is bounded by the
// boot's): the device state is ~0.9 MiB, the RAM ~90 MiB copied on the host.
const snapshotTimeout = 30 * time.Second

// errRestore is a snapshot that did not restore: the start is tried again
// with a cold boot, after the snapshot is removed. freshDisks: the disks
// were made by the failed start, and no guest ran on them.
type errRestore struct {
	err        error
	freshDisks bool
}

func (e errRestore) Error() string { return "restore the VM's snapshot: " + e.err.Error() }
func (e errRestore) Unwrap() error { return e.err }

// newRAM makes the guest's RAM: a memfd of the VM's memory size, passed to
// QEMU (microvm.Launch.RAMFD). Nothing is left anywhere once the shim and
// QEMU are gone.
func newRAM(memoryMiB int) (*os.File, error) {
	fd, err := unix.MemfdCreate("agentconnect-vm-ram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("the guest's RAM: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "agentconnect-vm-ram")
	if err := f.Truncate(int64(memoryMiB) << 20); err != nil {
		f.Close()
		return nil, fmt.Errorf("the guest's RAM: %w", err)
	}
	return f, nil
}

// kernelStub is c's microvm.Config.KernelStub in a memfd, for QEMU
// (microvm.Launch.KernelFD), or nil when c's kernel has none.
func kernelStub(c microvm.Config) (*os.File, error) {
	stub, err := c.KernelStub()
	if err != nil || stub == nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("agentconnect-vm-kernel", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("the restored VM's kernel header: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "agentconnect-vm-kernel")
	if _, err := f.Write(stub); err != nil {
		f.Close()
		return nil, fmt.Errorf("the restored VM's kernel header: %w", err)
	}
	return f, nil
}

// monitor is the shim's QMP connection to QEMU.
type monitor struct {
	mon *qmp.SocketMonitor
	// agentOpen is closed when the guest agent opens its serial port.
	agentOpen chan struct{}
}

// dialMonitor connects to QEMU's QMP socket, retrying while QEMU has not
// made it yet, until ctx ends.
func dialMonitor(ctx context.Context, path string) (*monitor, error) {
	var mon *qmp.SocketMonitor
	for {
		var err error
		if mon, err = qmp.NewSocketMonitor("unix", path, time.Second); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to QEMU's monitor at %s: %w (%v)", path, ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := mon.Connect(); err != nil {
		mon.Disconnect()
		return nil, fmt.Errorf("QEMU's monitor at %s: %w", path, err)
	}
	events, _ := mon.Events(ctx)
	m := &monitor{mon: mon, agentOpen: make(chan struct{})}
	go func() {
		var once sync.Once
		// Drained to the end (the connection's): the library blocks its
		// command replies behind an event nobody reads.
		for e := range events {
			if e.Event == "VSERPORT_CHANGE" && e.Data["id"] == microvm.AgentPortID && e.Data["open"] == true {
				once.Do(func() { close(m.agentOpen) })
			}
		}
	}()
	return m, nil
}

func (m *monitor) close() { m.mon.Disconnect() }

// run runs a QMP command and decodes its return into out (when not nil);
// with file, the file goes along (SCM_RIGHTS), for getfd.
func (m *monitor) run(name string, args any, file *os.File, out any) error {
	cmd, err := json.Marshal(qmp.Command{Execute: name, Args: args})
	if err != nil {
		return err
	}
	raw, err := m.mon.RunWithFile(cmd, file)
	if err != nil {
		return fmt.Errorf("QMP %s: %w", name, err)
	}
	if out == nil {
		return nil
	}
	var r struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("QMP %s: %w", name, err)
	}
	return json.Unmarshal(r.Return, out)
}

// ignoreShared keeps the guest's RAM (shared) out of the migration stream,
// on either side.
func (m *monitor) ignoreShared() error {
	return m.run("migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}, nil, nil)
}

// waitMigration polls the migration until it completes, fails, or ctx
// ends.
func (m *monitor) waitMigration(ctx context.Context) error {
	for {
		var st struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := m.run("query-migrate", nil, nil, &st); err != nil {
			return err
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.Error)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration still %q: %w", st.Status, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// restore loads snap's device state into QEMU (started with
// microvm.Launch.Incoming, its RAM already the snapshot's): the VM is
// paused afterwards.
func (m *monitor) restore(ctx context.Context, snap *vmsnapshot.Snapshot) error {
	if err := m.ignoreShared(); err != nil {
		return err
	}
	if err := m.run("getfd", map[string]any{"fdname": "snapshot"}, snap.State, nil); err != nil {
		return err
	}
	if err := m.run("migrate-incoming", map[string]any{"uri": "fd:snapshot"}, nil, nil); err != nil {
		return err
	}
	return m.waitMigration(ctx)
}

// save pauses the VM, saves it under key in store (its device state from
// QEMU, its RAM from ram) and leaves it paused.
func (m *monitor) save(ctx context.Context, store vmsnapshot.Store, key string, ram *os.File) error {
	if err := m.ignoreShared(); err != nil {
		return err
	}
	if err := m.run("stop", nil, nil, nil); err != nil {
		return err
	}
	return store.Save(key, func(state *os.File) error {
		if err := m.run("getfd", map[string]any{"fdname": "snapshot"}, state, nil); err != nil {
			return err
		}
		if err := m.run("migrate", map[string]any{"uri": "fd:snapshot"}, nil, nil); err != nil {
			return err
		}
		return m.waitMigration(ctx)
	}, ram)
}

// plugShares plugs the VM's shares in, each a vhost-user-fs device on its
// root port connected to its virtiofsd.
func (m *monitor) plugShares(cfg microvm.Config) error {
	for i := range cfg.Shares {
		chardev, device := cfg.ShareHotplug(i)
		if err := m.run("chardev-add", chardev, nil, nil); err != nil {
			return fmt.Errorf("plug share %s in: %w", cfg.Shares[i].Tag, err)
		}
		if err := m.run("device_add", device, nil, nil); err != nil {
			return fmt.Errorf("plug share %s in: %w", cfg.Shares[i].Tag, err)
		}
	}
	return nil
}

// restoreError returns err's errRestore, if it is a snapshot that did not
// restore.
func restoreError(err error) (errRestore, bool) {
	var r errRestore
	ok := errors.As(err, &r)
	return r, ok
}

// openSnapshot readies the VM's snapshot layout: the store, the key, the
// RAM. With restore, it opens the key's snapshot, if there is one.
func (vm *vmRun) openSnapshot(restore bool) (*vmsnapshot.Snapshot, error) {
	sb := vm.h.Session().Spec.Sandbox
	if sb == nil || sb.DaemonHome == "" {
		return nil, fmt.Errorf("session %s: no daemon home for the VM's snapshots", vm.h.Session().ID)
	}
	vm.store = vmsnapshot.Store{Dir: home.Layout{Root: sb.DaemonHome}.VMSnapshotsDir()}
	var err error
	if vm.snapKey, err = vm.cfg.SnapshotKey(vm.tools.QEMU); err != nil {
		return nil, err
	}
	if vm.ram, err = newRAM(vm.cfg.MemoryMiB); err != nil {
		return nil, err
	}
	if !restore {
		return nil, nil
	}
	snap, err := vm.store.Open(vm.snapKey)
	if err != nil {
		vm.h.Log().WithError(err).Warn("the VM's snapshot cannot be opened; booting")
		return nil, nil
	}
	return snap, nil
}

// restoreFailed removes the snapshot that did not restore, and says why
// (errRestore: prepareOrBoot boots instead).
func (vm *vmRun) restoreFailed(err error) error {
	if rmErr := vm.store.Remove(vm.snapKey); rmErr != nil {
		vm.h.Log().WithError(rmErr).Warn("remove the VM's snapshot that did not restore")
	}
	return vm.withQEMUErrors(errRestore{err: err, freshDisks: vm.freshDisks})
}

// snapshotOrRestore runs a VM with snapshots from QEMU's start until the
// guest runs with its shares plugged in: snap restored, or (with save) the
// boot saved as the key's snapshot when the guest agent opens its port (a
// snapshot that cannot be saved is logged, and the session goes on).
func (vm *vmRun) snapshotOrRestore(snap *vmsnapshot.Snapshot, save bool, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	// A QEMU that stops answering is ended: the library's calls have no
	// deadline of their own.
	context.AfterFunc(ctx, func() {
		if ctx.Err() == context.DeadlineExceeded {
			vm.killQEMU()
		}
	})
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	m, err := dialMonitor(ctx, vm.cfg.QMPSocket())
	if err != nil {
		return vm.withQEMUErrors(err)
	}
	vm.monitor = m
	if snap != nil {
		if err := m.restore(ctx, snap); err != nil {
			return vm.restoreFailed(err)
		}
		vm.st.Done("restore")
	} else {
		select {
		case <-m.agentOpen:
		case <-ctx.Done():
			return vm.withQEMUErrors(fmt.Errorf("the guest agent did not open its serial port: %w", ctx.Err()))
		}
		vm.st.Done("boot")
		if save {
			sctx, scancel := context.WithTimeout(ctx, snapshotTimeout)
			err := m.save(sctx, vm.store, vm.snapKey, vm.ram)
			scancel()
			if err != nil {
				vm.h.Log().WithError(err).Warn("the VM's snapshot was not saved: the next start boots too")
			} else {
				vm.h.Log().WithField("snapshot", vm.snapKey).Info("saved the VM's snapshot: later starts restore it")
			}
			vm.st.Done("save")
		}
	}
	if err := m.plugShares(vm.cfg); err != nil {
		return vm.withQEMUErrors(err)
	}
	if err := m.run("cont", nil, nil, nil); err != nil {
		return vm.withQEMUErrors(err)
	}
	vm.st.Done("shares")
	return nil
}
