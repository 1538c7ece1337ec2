package microsandbox

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/strategy/microsandbox/microvm"
)

const (
	// qemuStartTimeout bounds starting QEMU paused and quitting it.
	qemuStartTimeout = 10 * time.Second
	// kernelBootTimeout bounds booting the guest kernel to the end of its
	// start (the panic of a kernel with no root filesystem). A KVM that
	// works boots it in about a second; TCG on a 2-core machine in about
	// 4 s. A session allows the whole boot, the guest agent included, two
	// minutes (the shim's bootTimeout).
	kernelBootTimeout = 15 * time.Second
	// kernelBooted is what the guest kernel prints at the end of its start
	// when it finds no root filesystem: it ran every step a session's
	// kernel runs before its first process.
	kernelBooted = "Kernel panic - not syncing"
)

// fixFor is what to do when QEMU cannot run a guest with accelerator.
func fixFor(accelerator string) string {
	if accelerator == "kvm" {
		return `set sandbox.microsandbox.accelerator to "tcg" (software emulation, slower), ` +
			"or make KVM work here (on a virtual machine: nested virtualization on the host)"
	}
	return "see QEMU's message; sessions start QEMU the same way"
}

// checkQEMUStarts starts QEMU the way a session does (the machine,
// accelerator, CPU model, vCPUs, memory and sandbox of
// microvm.Config.MachineArgs, with the kernel and initramfs), paused (-S)
// with its QMP monitor on stdio, and quits it through QMP. The monitor
// answers only once the machine is built: the vCPUs created, their
// registers and MSRs set, the kernel loaded. So a host whose KVM refuses
// what `-cpu host` asks ("failed to set MSR 0x10a") fails here, with QEMU's
// words. It returns why QEMU cannot start, or "".
func checkQEMUStarts(qemu string, vm microvm.Config) string {
	var launch microvm.Launch
	var extra []*os.File
	if vm.Snapshots() {
		// The guest's RAM as a session's: a memfd QEMU opens by its path
		// in /proc.
		ram, err := newRAM(vm.MemoryMiB)
		if err != nil {
			return err.Error()
		}
		defer ram.Close()
		launch.RAMFD, extra = 3, []*os.File{ram}
	}
	args := append(vm.MachineArgs(launch), "-kernel", vm.Kernel, "-initrd", vm.Initrd, "-S", "-qmp", "stdio")
	ctx, cancel := context.WithTimeout(context.Background(), qemuStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.ExtraFiles = extra
	cmd.Stdin = strings.NewReader(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		return fmt.Sprintf("QEMU started the way sessions start it (%s) did not answer within %v: %s",
			accelArgs(vm), qemuStartTimeout, fixFor(vm.Accelerator))
	}
	if err != nil || strings.Count(stdout.String(), `"return"`) < 2 {
		return fmt.Sprintf("QEMU cannot start a VM the way sessions start it (%s): %s: %s",
			accelArgs(vm), qemuMessage(err, stderr.String()), fixFor(vm.Accelerator))
	}
	return ""
}

// checkKernelBoots boots the session's kernel the way a session does
// (MachineArgs), with no initramfs and no disk, until the kernel reports
// that it has no root filesystem: the end of its start. The probe runs it
// for KVM: some hosts' KVM runs a one-instruction guest and starts QEMU,
// yet runs a real guest far too slowly to boot (a nested or paravirtualized
// KVM that emulates what the guest's boot does), and every session would
// time out. It returns why the kernel did not boot, or "".
func checkKernelBoots(qemu string, vm microvm.Config) string {
	args := append(vm.MachineArgs(microvm.Launch{}), "-kernel", vm.Kernel, "-serial", "stdio", "-append", "console=ttyS0 quiet panic=-1")
	ctx, cancel := context.WithTimeout(context.Background(), kernelBootTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Sprintf("boot check: %v", err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr // read after Wait, which waits for it
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Sprintf("boot check: start %s: %v", qemu, err)
	}
	booted := false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.Contains(sc.Text(), kernelBooted) {
			booted = true
			cancel() // it has shown what it had to: QEMU goes
			break
		}
	}
	err = cmd.Wait()
	switch {
	case booted:
		return ""
	case ctx.Err() != nil:
		return fmt.Sprintf("QEMU (%s, as sessions run it) did not boot the guest kernel within %v (a KVM that works does in about a second): "+
			"this machine cannot run a Linux guest at a usable speed with it, and every session would time out: %s",
			accelArgs(vm), kernelBootTimeout, fixFor(vm.Accelerator))
	case err == nil && strings.TrimSpace(stderr.String()) == "":
		return fmt.Sprintf("QEMU (%s, as sessions run it) exited before the guest kernel booted: the guest reset: %s",
			accelArgs(vm), fixFor(vm.Accelerator))
	default:
		return fmt.Sprintf("QEMU (%s, as sessions run it) stopped before the guest kernel booted: %s: %s",
			accelArgs(vm), qemuMessage(err, stderr.String()), fixFor(vm.Accelerator))
	}
}

// accelArgs names the accelerator and CPU model of vm, as QEMU gets them.
func accelArgs(vm microvm.Config) string {
	args := vm.MachineArgs(microvm.Launch{})
	for i, a := range args {
		if a == "-accel" {
			return strings.Join(args[i:], " ")
		}
	}
	return "no -accel"
}

// maxQEMUMessage bounds how much of QEMU's stderr a reason quotes.
const maxQEMUMessage = 500

// qemuMessage is what QEMU said, or how it ended when it said nothing.
func qemuMessage(err error, stderr string) string {
	msg := strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(stderr), "\n", "; ")), " ")
	if msg == "" {
		if err == nil {
			return "it did not answer on its monitor"
		}
		return err.Error()
	}
	return errdefs.Clip(msg, maxQEMUMessage)
}
