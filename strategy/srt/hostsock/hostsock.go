// Package hostsock finds the host's bound unix sockets, so that an srt
// sandbox, whose processes may make and use unix sockets of their own, can
// be built with every host socket its view would show hidden.
//
// A read-only bind does not stop connect(2): the kernel asks for write
// permission on the socket's inode and refuses writes on read-only mounts
// only for files, directories and links. So the sockets are found by what
// the kernel knows is bound (sock_diag: the name given to bind and the
// socket file's device and inode), not by walking the host's trees at each
// start, and each one the view shows is covered.
package hostsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/mountinfo"
	"github.com/agentconnect-md/agentconnect/internal/netns"
)

// Socket is a bound pathname socket: the name it was bound with (as its
// binder saw it: absolute or relative, in its own mount namespace), and
// its file's device (as stat reports it) and inode, 0 and 0 when unknown.
type Socket struct {
	Name string
	Dev  uint64
	Ino  uint64
	// SockIno is the socket's own inode (in sockfs): with Dev and Ino it
	// tells this socket from a later one given the same file inode.
	SockIno uint64
}

// sock_diag for AF_UNIX (include/uapi/linux/unix_diag.h); x/sys/unix does
// not carry these.
const (
	udiagShowName = 0x1
	udiagShowVFS  = 0x2
	unixDiagName  = 0
	unixDiagVFS   = 1
	// sizeofUnixDiagReq and sizeofUnixDiagMsg are the structs' sizes.
	sizeofUnixDiagReq = 24
	sizeofUnixDiagMsg = 16
)

// Bound lists the pathname sockets bound in the calling thread's network
// namespace, in every state (a datagram socket is reachable without
// listening). Abstract sockets are left out: they belong to a network
// namespace, and a sandbox has its own.
func Bound() ([]Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	req := make([]byte, unix.NLMSG_HDRLEN+sizeofUnixDiagReq)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(req[8:], 1) // sequence
	body := req[unix.NLMSG_HDRLEN:]
	body[0] = unix.AF_UNIX
	ne.PutUint32(body[4:], 0xffffffff) // every state
	ne.PutUint32(body[12:], udiagShowName|udiagShowVFS)
	ne.PutUint32(body[16:], 0xffffffff) // no cookie
	ne.PutUint32(body[20:], 0xffffffff)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	var out []Socket
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("sock_diag: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("sock_diag: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(ne.Uint32(m.Data)); e < 0 {
						return nil, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
					}
				}
				return nil, errors.New("sock_diag: an error message without a code")
			}
			if s, ok := parseMsg(m.Data); ok {
				out = append(out, s)
			}
		}
	}
}

// parseMsg reads one unix_diag_msg and its attributes: a socket with a
// pathname and a file, or false.
func parseMsg(b []byte) (Socket, bool) {
	if len(b) < sizeofUnixDiagMsg {
		return Socket{}, false
	}
	ne := binary.NativeEndian
	s := Socket{SockIno: uint64(ne.Uint32(b[4:]))}
	vfs := false
	for a := b[sizeofUnixDiagMsg:]; len(a) >= unix.SizeofRtAttr; {
		l := int(ne.Uint16(a[0:]))
		if l < unix.SizeofRtAttr || l > len(a) {
			break
		}
		data := a[unix.SizeofRtAttr:l]
		switch ne.Uint16(a[2:]) {
		case unixDiagName:
			// sun_path as bound: NUL-terminated, or NUL-led for an
			// abstract name.
			s.Name = string(data)
			if s.Name != "" && s.Name[0] != 0 {
				s.Name = strings.TrimRight(s.Name, "\x00")
			}
		case unixDiagVFS:
			if len(data) >= 8 {
				s.Ino = uint64(ne.Uint32(data[0:]))
				// The kernel's dev_t (major << 20 | minor), as stat encodes it.
				kdev := ne.Uint32(data[4:])
				s.Dev = unix.Mkdev(kdev>>20, kdev&0xfffff)
				vfs = true
			}
		}
		adv := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if adv > len(a) {
			break
		}
		a = a[adv:]
	}
	if !vfs || s.Name == "" || s.Name[0] == 0 {
		return Socket{}, false
	}
	return s, true
}

// BoundEverywhere is Bound in the calling thread's network namespace and
// in every other one a process of this host is in: a container's socket in
// a host directory it shares is a host socket too. Each namespace is asked
// once. Root enters each (setns) and gets each socket's file; another user
// cannot, and gets the names in the others' /proc/PID/net/unix, with no
// file (Dev and Ino 0).
func BoundEverywhere() ([]Socket, error) {
	own, err := Bound()
	if err != nil {
		return nil, err
	}
	// /proc/PID/net/unix is a file of PID's network namespace: its inode
	// tells the namespaces apart, for any user.
	var self unix.Stat_t
	if err := unix.Stat("/proc/thread-self/net/unix", &self); err != nil {
		return nil, fmt.Errorf("network namespace: %w", err)
	}
	seen := map[uint64]bool{self.Ino: true}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	root := os.Geteuid() == 0
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/net/unix", &st) != nil || seen[st.Ino] {
			continue // gone, or known
		}
		seen[st.Ino] = true
		var socks []Socket
		if root {
			socks, err = boundIn("/proc/" + e.Name() + "/ns/net")
		} else {
			socks, err = namesIn("/proc/" + e.Name() + "/net/unix")
		}
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
				continue // the process ended
			}
			return nil, fmt.Errorf("network namespace of pid %s: %w", e.Name(), err)
		}
		own = append(own, socks...)
	}
	return own, nil
}

// namesIn reads the pathname sockets of a /proc/PID/net/unix file: the
// name each was bound with (its last column; abstract names start with @).
func namesIn(path string) ([]Socket, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Socket
	lines := strings.Split(string(data), "\n")
	for _, line := range lines[min(1, len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 8 || strings.HasPrefix(f[7], "@") {
			continue
		}
		// A name with spaces is the rest of the line.
		_, name, _ := strings.Cut(line, " "+f[6]+" ")
		out = append(out, Socket{Name: strings.TrimSpace(name)})
	}
	return out, nil
}

// boundIn runs Bound in the network namespace at path (netns.Do).
func boundIn(path string) ([]Socket, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var socks []Socket
	err = netns.Do(int(f.Fd()), func() error {
		var err error
		socks, err = Bound()
		return err
	})
	return socks, err
}

// Mounts are the devices of the mounts under which a host path may lie,
// from /proc/self/mountinfo: mount point → device (as stat reports it).
func Mounts() (map[string]uint64, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		major, minor, ok := strings.Cut(f[2], ":")
		ma, err1 := strconv.ParseUint(major, 10, 32)
		mi, err2 := strconv.ParseUint(minor, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		out[mountinfo.Unescape(f[4])] = unix.Mkdev(uint32(ma), uint32(mi))
	}
	return out, nil
}
