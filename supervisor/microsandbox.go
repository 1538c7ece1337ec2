package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/agentconnect-md/agentconnect/api/helper"
	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/internal/errdefs"
	"github.com/agentconnect-md/agentconnect/internal/fileid"
	"github.com/agentconnect-md/agentconnect/supervisor/agent"
	"github.com/agentconnect-md/agentconnect/supervisor/runtimes"
)

// vmSpec is the VM a microsandbox session of a runs in: the daemon's VM
// settings with the agent's overrides, the image (the default one, or the
// configured one prepared on first use), and the agent's directories and
// mounts as virtiofs shares at their host paths, then the extra mounts the
// supervisor adds (a runtime's tree).
func (s *Supervisor) vmSpec(a agent.Agent, spec session.Spec, extra []session.Mount) (*session.VM, error) {
	settings := s.cfg.VM
	vm := &session.VM{
		CPUs: settings.CPUs, MemoryMiB: settings.MemoryMiB, DiskGiB: settings.DiskGiB,
		Accelerator: settings.Accelerator, Transport: settings.Transport, TCGCacheMiB: settings.TCGCacheMiB,
		Hidden: append([]string{s.opts.Home}, homesToHide()...),
	}
	if a.Resources.CPUs > 0 {
		vm.CPUs = a.Resources.CPUs
	}
	if a.Resources.MemoryMiB > 0 {
		vm.MemoryMiB = a.Resources.MemoryMiB
	}
	if a.Resources.DiskGiB > 0 {
		vm.DiskGiB = a.Resources.DiskGiB
	}
	if vm.MemoryMiB < 128 {
		return nil, errdefs.InvalidArgument("agent %s: a VM needs at least 128 MiB of memory, not %d", a.Name, vm.MemoryMiB)
	}
	// The image comes from agentconnect-vmimage (it links the image code;
	// the daemon and the VM's shim do not): the default one, or the
	// configured one, prepared on first use.
	if s.opts.VMImageBinary == "" {
		return nil, errdefs.FailedPrecondition("agentconnect-vmimage, which prepares microsandbox's guest images, is not installed beside agentconnect (make install)")
	}
	req := helper.ImageRequest{ImageDir: s.opts.ImageDir, ImagesDir: s.layout.ImagesDir(), Ref: settings.Image}
	img, err := s.images.answer(s.ctx, s.opts.VMImageBinary, req, s.log.Infof)
	if err != nil {
		return nil, fmt.Errorf("prepare the guest image: %w", err)
	}
	if img.Error != "" {
		if settings.Image != "" {
			return nil, errdefs.FailedPrecondition("sandbox.microsandbox.image: %s", img.Error)
		}
		return nil, errdefs.FailedPrecondition("%s", img.Error)
	}
	vm.Kernel, vm.Initrd, vm.Rootfs, vm.ImageDigest = img.Kernel, img.Initrd, img.Rootfs, img.Digest
	for i, d := range []string{spec.Workspace, spec.Home, spec.Memory, spec.Tmp} {
		vm.Shares = append(vm.Shares, session.VMShare{Tag: []string{"workspace", "home", "memory", "tmp"}[i], Source: d, Target: d})
	}
	for i, m := range a.Mounts {
		vm.Shares = append(vm.Shares, session.VMShare{Tag: "mount" + strconv.Itoa(i), Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	for i, m := range extra {
		if imageHas(img.Runtimes, m.Target) {
			continue // the image's own tree, at the pinned version
		}
		vm.Shares = append(vm.Shares, session.VMShare{Tag: "runtime" + strconv.Itoa(i), Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	vm.CredentialLayout = credentialLayout(a)
	return vm, nil
}

// imageAnswers keeps agentconnect-vmimage's last answer that says what it
// was read from (the default image's files), and gives it again while the
// request, the helper's binary and each of those files are the same
// versions: the helper is a process start (~15 ms on a slow host) on every
// VM start's path, a warm claim's too. Errors are never kept: a start after
// `make image` sees the image.
type imageAnswers struct {
	mu     sync.Mutex
	req    helper.ImageRequest
	binary fileid.ID
	resp   helper.ImageResponse // with Inputs; the zero value keeps nothing
}

func (c *imageAnswers) answer(ctx context.Context, binary string, req helper.ImageRequest, logf func(string, ...any)) (helper.ImageResponse, error) {
	bin, berr := fileid.Of(binary)
	c.mu.Lock()
	kept := c.resp
	hit := berr == nil && c.req == req && c.binary == bin && len(kept.Inputs) > 0
	c.mu.Unlock()
	if hit && fileid.Unchanged(kept.Inputs...) {
		return kept, nil
	}
	var resp helper.ImageResponse
	if err := helper.Call(ctx, binary, "image", req, &resp, logf); err != nil {
		return helper.ImageResponse{}, err
	}
	// The binary's version from before the call: one replaced meanwhile
	// does not match it next time.
	if resp.Error == "" && len(resp.Inputs) > 0 && berr == nil {
		c.mu.Lock()
		c.req, c.binary, c.resp = req, bin, resp
		c.mu.Unlock()
	}
	return resp, nil
}

// imageHas reports whether the image holds, at target, the tree of a known
// runtime at the version this release pins: no share is needed for it.
func imageHas(inImage map[string]string, target string) bool {
	name, ok := strings.CutPrefix(target, runtimes.MountRoot+"/")
	rt, known := runtimes.Known[name]
	return ok && known && inImage[name] == rt.Package+"@"+rt.Version
}

// placeVM gives a run of a VM session its directories: its disks in
// vms/<session>/<identity>, kept across stop and resume while the identity
// holds and replaced (the VM rebuilt) when it changes; its sockets in a
// short runtime directory.
func (s *Supervisor) placeVM(rec *session.Record) error {
	vm := rec.Spec.VM
	id := vm.Identity()
	base := filepath.Join(s.layout.VMsDir(), rec.ID)
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if e.Name() != id {
			s.log.WithFields(map[string]any{"session": rec.ID, "old": e.Name(), "new": id}).Info("VM identity changed: rebuilding the VM")
			if err := os.RemoveAll(filepath.Join(base, e.Name())); err != nil {
				return fmt.Errorf("remove the old VM: %w", err)
			}
		}
	}
	vm.Dir = filepath.Join(base, id)
	runDir, err := s.layout.RunDirFor(fmt.Sprintf("%s/%d", rec.ID, rec.Run))
	if err != nil {
		return err
	}
	vm.RunDir = runDir
	sum := sha256.Sum256([]byte(rec.ID))
	vm.CID = 3 + binary.BigEndian.Uint32(sum[:4])%(1<<30) // 0-2 are reserved
	return nil
}
