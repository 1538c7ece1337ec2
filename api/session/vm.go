package session

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// The guest user a microsandbox session's runtime runs as: unprivileged in
// the guest, with Docker through its docker group. The image makes it
// (scripts/build-image.sh), and each share shows its root's owner as this
// user, so that the runtime owns what the agent owns (see microvm.ShareIDMap).
const (
	VMRuntimeUser = "agent"
	VMRuntimeUID  = 10001
)

// VMShare is a host directory shared into a microsandbox guest with virtiofs.
type VMShare struct {
	Tag      string `json:"tag"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readonly"`
}

// VM is a microsandbox session's VM, as the supervisor chose it: its image,
// size, shares and where its files are.
type VM struct {
	Kernel      string `json:"kernel"`
	Initrd      string `json:"initrd"`
	Rootfs      string `json:"rootfs"`
	ImageDigest string `json:"imageDigest"`
	CPUs        int    `json:"cpus"`
	MemoryMiB   int    `json:"memoryMiB"`
	DiskGiB     int    `json:"diskGiB"`
	Accelerator string `json:"accelerator"` // kvm or tcg
	Transport   string `json:"transport"`   // vsock or serial
	// TCGCacheMiB bounds QEMU's translation cache under tcg (tb-size); 0:
	// QEMU's default. Not part of the identity: the guest does not see it.
	TCGCacheMiB int       `json:"tcgCacheMiB,omitempty"`
	Shares      []VMShare `json:"shares"`
	// Dir holds the VM's disks; it is the VM's identity directory.
	Dir string `json:"dir"`
	// RunDir holds its sockets (short paths).
	RunDir string `json:"runDir"`
	// CID is the guest's vsock context id, with the vsock transport.
	CID uint32 `json:"cid"`
	// Hidden are directories QEMU and virtiofsd may not see (the daemon's
	// home), apart from the VM's own files.
	Hidden []string `json:"hidden"`
	// CredentialLayout says where the run's secrets are inside, not what
	// they are: "env VAR=SECRET" for each binding, "allow NAME" for each
	// credential file the agent opted in. Part of the identity.
	CredentialLayout []string `json:"credentialLayout,omitempty"`
}

// Identity is the hash of everything that makes a VM what it is: the image
// content, its size, its mounts and its credential layout. A VM whose
// identity changed is rebuilt (new disks); one whose identity is the same
// keeps its disks across stop and resume, even under a new image tag.
func (c VM) Identity() string {
	type share struct {
		Source, Target string
		ReadOnly       bool
	}
	id := struct {
		Image              string
		CPUs, Memory, Disk int
		Shares             []share
		CredentialLayout   int
		// Empty, it leaves the identities of VMs made before it as they were.
		Credentials []string `json:",omitempty"`
	}{Image: c.ImageDigest, CPUs: c.CPUs, Memory: c.MemoryMiB, Disk: c.DiskGiB, CredentialLayout: 1, Credentials: c.CredentialLayout}
	for _, s := range c.Shares {
		id.Shares = append(id.Shares, share{s.Source, s.Target, s.ReadOnly})
	}
	data, _ := json.Marshal(id)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])[:16]
}
