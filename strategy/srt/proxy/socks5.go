package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"time"
)

// SOCKS5 constants (RFC 1928).
const (
	socksNoAuth       = 0x00
	socksNoAcceptable = 0xff

	socksCmdConnect = 0x01

	socksAtypIPv4   = 0x01
	socksAtypDomain = 0x03
	socksAtypIPv6   = 0x04

	socksSucceeded           = 0x00
	socksGeneralFailure      = 0x01
	socksNotAllowed          = 0x02
	socksNetworkUnreachable  = 0x03
	socksHostUnreachable     = 0x04
	socksConnectionRefused   = 0x05
	socksCommandNotSupported = 0x07
	socksAddrNotSupported    = 0x08
)

// serveSOCKS5 runs one SOCKS5 exchange: no-auth method negotiation, then a
// CONNECT request, then a tunnel.
func (s *Server) serveSOCKS5(ctx context.Context, set *connSet, cc *clientConn) {
	var hdr [2]byte
	if _, err := io.ReadFull(cc.br, hdr[:]); err != nil {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(cc.br, methods); err != nil {
		return
	}
	if !slices.Contains(methods, socksNoAuth) {
		cc.Write([]byte{socks5Version, socksNoAcceptable})
		return
	}
	if _, err := cc.Write([]byte{socks5Version, socksNoAuth}); err != nil {
		return
	}

	var req [4]byte // VER CMD RSV ATYP
	if _, err := io.ReadFull(cc.br, req[:]); err != nil || req[0] != socks5Version {
		return
	}
	host, port, ok := readSOCKSAddr(cc, req[3])
	if !ok {
		return
	}
	if req[1] != socksCmdConnect {
		writeSOCKSReply(cc, socksCommandNotSupported, nil)
		return
	}
	if port == 0 {
		writeSOCKSReply(cc, socksGeneralFailure, nil)
		return
	}
	cc.SetDeadline(time.Time{})
	up, err := s.connect(ctx, "socks5", host, port)
	if err != nil {
		writeSOCKSReply(cc, socksReplyCode(err), nil)
		return
	}
	if !set.add(up) {
		up.Close()
		return
	}
	defer set.remove(up)
	defer up.Close()
	if writeSOCKSReply(cc, socksSucceeded, up.LocalAddr()) != nil {
		return
	}
	s.relay(ctx, cc, up, "socks5", host, port)
}

// readSOCKSAddr reads DST.ADDR and DST.PORT. An unknown address type is
// answered here; ok is false when the exchange is over.
func readSOCKSAddr(cc *clientConn, atyp byte) (host string, port int, ok bool) {
	var addr []byte
	switch atyp {
	case socksAtypIPv4:
		addr = make([]byte, 4)
	case socksAtypIPv6:
		addr = make([]byte, 16)
	case socksAtypDomain:
		n, err := cc.br.ReadByte()
		if err != nil {
			return "", 0, false
		}
		addr = make([]byte, n)
	default:
		writeSOCKSReply(cc, socksAddrNotSupported, nil)
		return "", 0, false
	}
	var p [2]byte
	if _, err := io.ReadFull(cc.br, addr); err != nil {
		return "", 0, false
	}
	if _, err := io.ReadFull(cc.br, p[:]); err != nil {
		return "", 0, false
	}
	switch atyp {
	case socksAtypIPv4:
		host = netip.AddrFrom4([4]byte(addr)).String()
	case socksAtypIPv6:
		host = netip.AddrFrom16([16]byte(addr)).String()
	default:
		host = string(addr)
	}
	return host, int(binary.BigEndian.Uint16(p[:])), true
}

// writeSOCKSReply sends a reply; bound is the proxy's side of the upstream
// connection (0.0.0.0:0 when nil or not TCP).
func writeSOCKSReply(c net.Conn, code byte, bound net.Addr) error {
	ap := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if ta, ok := bound.(*net.TCPAddr); ok && ta.AddrPort().Addr().IsValid() {
		ap = ta.AddrPort()
	}
	b := []byte{socks5Version, code, 0x00}
	if ip := ap.Addr().Unmap(); ip.Is4() {
		b = append(b, socksAtypIPv4)
		b = append(b, ip.AsSlice()...)
	} else {
		b = append(b, socksAtypIPv6)
		b = append(b, ip.AsSlice()...)
	}
	b = binary.BigEndian.AppendUint16(b, ap.Port())
	c.SetWriteDeadline(time.Now().Add(replyTimeout))
	_, err := c.Write(b)
	return err
}

// socksReplyCode maps a connect failure to a SOCKS5 reply code.
func socksReplyCode(err error) byte {
	var re *refusedError
	var rerr *resolveError
	switch {
	case errors.As(err, &re):
		return socksNotAllowed
	case errors.As(err, &rerr):
		return socksHostUnreachable
	case errors.Is(err, syscall.ECONNREFUSED):
		return socksConnectionRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return socksNetworkUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return socksHostUnreachable
	}
	return socksGeneralFailure
}
