package vmagent

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The guest's network is configured over rtnetlink, with no tool from the
// image: a link up, one IPv4 address, one default route.

// linkUp sets the link called name up.
func linkUp(name string) error {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	msg := unix.IfInfomsg{Family: unix.AF_UNSPEC, Index: int32(ifc.Index), Flags: unix.IFF_UP, Change: unix.IFF_UP}
	if err := netlinkDo(unix.RTM_NEWLINK, 0, structBytes(&msg), nil); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// addAddress gives the link called name the IPv4 address prefix.
func addAddress(name string, prefix netip.Prefix) error {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("add address %s to %s: %w", prefix, name, err)
	}
	addr := prefix.Addr().As4()
	msg := unix.IfAddrmsg{Family: unix.AF_INET, Prefixlen: uint8(prefix.Bits()), Index: uint32(ifc.Index)}
	attrs := []rtattr{{unix.IFA_LOCAL, addr[:]}, {unix.IFA_ADDRESS, addr[:]}}
	if prefix.Bits() < 31 {
		bcast := broadcast(prefix)
		attrs = append(attrs, rtattr{unix.IFA_BROADCAST, bcast[:]})
	}
	if err := netlinkDo(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, structBytes(&msg), attrs); err != nil {
		return fmt.Errorf("add address %s to %s: %w", prefix, name, err)
	}
	return nil
}

func broadcast(p netip.Prefix) [4]byte {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := binary.BigEndian.Uint32(a[:]) | host
	binary.BigEndian.PutUint32(a[:], v)
	return a
}

// addDefaultRoute routes everything through gw on the link called name.
func addDefaultRoute(name string, gw netip.Addr) error {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return fmt.Errorf("add default route via %s: %w", gw, err)
	}
	msg := unix.RtMsg{
		Family:   unix.AF_INET,
		Table:    unix.RT_TABLE_MAIN,
		Protocol: unix.RTPROT_BOOT,
		Scope:    unix.RT_SCOPE_UNIVERSE,
		Type:     unix.RTN_UNICAST,
	}
	g := gw.As4()
	var oif [4]byte
	binary.NativeEndian.PutUint32(oif[:], uint32(ifc.Index))
	attrs := []rtattr{{unix.RTA_GATEWAY, g[:]}, {unix.RTA_OIF, oif[:]}}
	if err := netlinkDo(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, structBytes(&msg), attrs); err != nil {
		return fmt.Errorf("add default route via %s dev %s: %w", gw, name, err)
	}
	return nil
}

type rtattr struct {
	typ  uint16
	data []byte
}

func structBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

func align4(n int) int { return (n + 3) &^ 3 }

var netlinkSeq atomic.Uint32

// netlinkDo sends one rtnetlink request and waits for its acknowledgement.
func netlinkDo(typ uint16, flags uint16, body []byte, attrs []rtattr) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}

	msg := make([]byte, unix.NLMSG_HDRLEN, 256)
	msg = append(msg, body...)
	msg = msg[:align4(len(msg))]
	for _, a := range attrs {
		var h [unix.SizeofRtAttr]byte
		binary.NativeEndian.PutUint16(h[0:2], uint16(unix.SizeofRtAttr+len(a.data)))
		binary.NativeEndian.PutUint16(h[2:4], a.typ)
		msg = append(msg, h[:]...)
		msg = append(msg, a.data...)
		for len(msg)%4 != 0 {
			msg = append(msg, 0)
		}
	}
	seq := netlinkSeq.Add(1)
	hdr := unix.NlMsghdr{
		Len:   uint32(len(msg)),
		Type:  typ,
		Flags: unix.NLM_F_REQUEST | unix.NLM_F_ACK | flags,
		Seq:   seq,
	}
	copy(msg, structBytes(&hdr))
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}

	buf := make([]byte, 8192)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq || m.Header.Type != unix.NLMSG_ERROR {
				continue
			}
			if len(m.Data) < 4 {
				return fmt.Errorf("netlink: short error message")
			}
			if errno := int32(binary.NativeEndian.Uint32(m.Data[:4])); errno != 0 {
				return syscall.Errno(-errno)
			}
			return nil
		}
	}
}
