// Package vmagent is agentconnect-vmagent, PID 1 of a session's VM: it
// brings the guest up, builds its root and runs the session's processes for
// the shim, which talks to it over vsock or a virtio-serial port
// (api/vmagent/v1).
package vmagent

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/vmtransport"
)

// portWait bounds the wait for the serial port to show up with its name
// after virtio_console is loaded.
const portWait = 10 * time.Second

// Main runs the agent, and exits when it fails.
func Main() {
	logf := log.New(os.Stderr, "vmagent: ", 0).Printf
	if err := run(logf); err != nil {
		logf("%v", err)
		if os.Getpid() == 1 {
			// Exiting would panic the kernel; power off so the host sees
			// the VM end, with this line on the console.
			if err := powerOff(); err != nil {
				logf("%v", err)
			}
		}
		os.Exit(1)
	}
}

// run is the agent's life: boot the guest (as PID 1), listen on the
// transport the kernel command line names, serve until the VM powers off.
func run(logf func(string, ...any)) error {
	started := uptime()
	pid1 := os.Getpid() == 1
	if pid1 {
		if err := mountAll("/", systemMounts); err != nil {
			return fmt.Errorf("boot: %w", err)
		}
		openConsole()
		// Signals that would end a Go program must not end PID 1 (which
		// panics the kernel). Handled, not ignored: children must not
		// inherit an ignored disposition.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	}
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	cfg, err := parseCmdline(string(cmdline))
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	modulesLoaded := make(chan struct{})
	if pid1 {
		loadBootModules(cfg, modulesLoaded, logf)
		if err := linkUp("lo"); err != nil {
			logf("boot: %v", err)
		}
	} else {
		close(modulesLoaded)
	}

	ctx := context.Background()
	procs := newProcTable(pid1, logf)
	go procs.reapLoop(ctx)
	svc := &service{
		logf:     logf,
		procs:    procs,
		streams:  newPendingStreams(logf),
		paths:    guestPaths,
		setup:    runSetup,
		trust:    func(ca string) error { return trustSessionCA("/", ca) },
		modules:  modulesLoaded,
		powerOff: powerOff,

		waitStreams: streamWait,
	}
	if !pid1 {
		svc.powerOff = func() error { return fmt.Errorf("not PID 1: not powering off") }
	}
	a, err := newAgent(svc)
	if err != nil {
		return err
	}
	ln, err := listen(cfg, logf)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	logf("serving on %s %s: started %v after the kernel, ready %v later",
		cfg.transport, ln.Addr(), started.Round(time.Millisecond), (uptime() - started).Round(time.Millisecond))
	return a.serve(ctx, ln)
}

// loadBootModules loads the transport's modules, then the others (in the
// background with vsock), and closes loaded once they all are. Built-in drivers may do
// without: a missing modules directory is only logged.
func loadBootModules(cfg bootConfig, loaded chan<- struct{}, logf func(string, ...any)) {
	dir := filepath.Join("/lib/modules", kernelRelease())
	ix, err := readModuleIndex(dir)
	if err != nil {
		logf("boot: %v", err)
		close(loaded)
		return
	}
	transport := serialModules
	if cfg.transport == "vsock" {
		transport = vsockModules
	}
	ix.loadModules(dir, transport, logf)
	if cfg.transport != "vsock" {
		// A serial VM is saved as a snapshot when its guest agent opens
		// the port (see the shim's snapshot.go): with every driver loaded
		// by then, no restored guest loads them again (~0.75 s of TCG).
		// Setup waited for them anyway.
		ix.loadModules(dir, setupModules, logf)
		dropModuleFiles(dir, logf)
		close(loaded)
		settleMemory(logf)
		return
	}
	go func() {
		defer close(loaded)
		ix.loadModules(dir, setupModules, logf)
		dropModuleFiles(dir, logf)
	}()
}

// dropModuleFiles removes the initramfs's module files once the agent has
// loaded what it loads: the kernel holds its own copy of each module, and
// the initramfs is RAM for the VM's life (1.7 MiB of every VM, and of a
// snapshot). The root Setup mounts hides the initramfs's /lib/modules.
func dropModuleFiles(dir string, logf func(string, ...any)) {
	if err := os.RemoveAll(dir); err != nil {
		logf("boot: %v", err)
	}
}

// listen opens the transport cfg names.
func listen(cfg bootConfig, logf func(string, ...any)) (net.Listener, error) {
	if cfg.transport == "vsock" {
		return vmtransport.ListenVsock(cfg.port)
	}
	var path string
	var err error
	if !pollUntil(portWait, func() bool {
		path, err = vmtransport.FindSerialPort(vmtransport.SerialPortName)
		return err == nil
	}) {
		return nil, fmt.Errorf("%w (waited %v; is the host's -device virtserialport,name=%s there?)",
			err, portWait, vmtransport.SerialPortName)
	}
	return vmtransport.ListenSerial(path, vmtransport.WithLogf(logf))
}

// reportWait is how long a serial guest agent leaves free page reporting
// before it opens its port: the report comes ~2 s after the frees
// (PAGE_REPORTING_DELAY).
const reportWait = 2500 * time.Millisecond

// reportingOrder is where the kernel keeps the smallest free block free
// page reporting hands back to the host (virtio_balloon sets it to 2 MiB's
// order when it registers).
const reportingOrder = "/sys/module/page_reporting/parameters/page_reporting_order"

// settleMemory hands the host back all the memory the boot freed: a serial
// VM is saved as a snapshot when its guest agent opens its port, and every
// clone copies what the snapshot holds. For reportWait it has free page
// reporting report every free page, not only whole 2 MiB blocks, with the
// clean caches dropped and free memory compacted; then it puts the order
// back, so that no clone runs with 4 KiB reports (a host page fault on every
// page a busy guest frees and takes again). 123 -> 83-94 MiB per snapshot
// here, for 2.5 s of the boot that saves it.
func settleMemory(logf func(string, ...any)) {
	order, err := os.ReadFile(reportingOrder)
	if err == nil {
		err = os.WriteFile(reportingOrder, []byte("0"), 0)
	}
	if err != nil {
		logf("boot: %s: %v", reportingOrder, err)
		order = nil
	}
	for knob, val := range map[string]string{"/proc/sys/vm/drop_caches": "3", "/proc/sys/vm/compact_memory": "1"} {
		if err := os.WriteFile(knob, []byte(val), 0); err != nil {
			logf("boot: %s: %v", knob, err)
		}
	}
	time.Sleep(reportWait)
	if order != nil {
		if err := os.WriteFile(reportingOrder, order, 0); err != nil {
			logf("boot: %s: %v", reportingOrder, err)
		}
	}
}
