package vmnet

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// maxFrame bounds one frame from QEMU: an Ethernet frame of the largest MTU
// a virtio-net guest can set, with room for a VLAN tag.
const maxFrame = 65535 + header.EthernetMinimumSize + 4

// endpoint is the gateway's NIC, a stack.LinkEndpoint on Ethernet. It does
// what gvisor-tap-vsock's tap.LinkEndpoint does (that package's import of
// gopacket/layers alone costs a process about 8 MB of RSS at init): frames
// carry an Ethernet header, link addresses are resolved with ARP, and ARP
// replies are sent only for the addresses in arpFor, so that the gateway,
// which is promiscuous and spoofs addresses to forward, does not claim
// every address of the subnet.
type endpoint struct {
	mac    tcpip.LinkAddress
	arpFor map[[4]byte]bool
	out    func(framed []byte) // sends one frame, with QEMU's length prefix

	mu         sync.RWMutex
	dispatcher stack.NetworkDispatcher
}

func newEndpoint(mac string, arpFor []netip.Addr, out func([]byte)) (*endpoint, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return nil, err
	}
	e := &endpoint{mac: tcpip.LinkAddress(hw), arpFor: make(map[[4]byte]bool), out: out}
	for _, a := range arpFor {
		e.arpFor[a.As4()] = true
	}
	return e, nil
}

func (e *endpoint) MTU() uint32                             { return MTU }
func (e *endpoint) SetMTU(uint32)                           {}
func (e *endpoint) MaxHeaderLength() uint16                 { return header.EthernetMinimumSize }
func (e *endpoint) LinkAddress() tcpip.LinkAddress          { return e.mac }
func (e *endpoint) SetLinkAddress(tcpip.LinkAddress)        {}
func (e *endpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }
func (e *endpoint) AddHeader(*stack.PacketBuffer)           {}
func (e *endpoint) ParseHeader(*stack.PacketBuffer) bool    { return true }
func (e *endpoint) Wait()                                   {}
func (e *endpoint) Close()                                  {}
func (e *endpoint) SetOnCloseAction(func())                 {}
func (e *endpoint) Capabilities() stack.LinkEndpointCapabilities {
	// Checksums are not verified again: frames come over a local socket.
	return stack.CapabilityResolutionRequired | stack.CapabilityRXChecksumOffload
}

func (e *endpoint) Attach(d stack.NetworkDispatcher) {
	e.mu.Lock()
	e.dispatcher = d
	e.mu.Unlock()
}

func (e *endpoint) IsAttached() bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.dispatcher != nil
}

// deliver passes an inbound packet (Ethernet header removed) to the stack.
func (e *endpoint) deliver(proto tcpip.NetworkProtocolNumber, payload []byte) {
	e.mu.RLock()
	d := e.dispatcher
	e.mu.RUnlock()
	if d == nil {
		return
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(payload)}) // copies
	d.DeliverNetworkPacket(proto, pkt)
	pkt.DecRef()
}

// WritePackets sends the stack's outbound packets.
func (e *endpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		src := e.mac
		if pkt.EgressRoute.LocalLinkAddress != "" {
			src = pkt.EgressRoute.LocalLinkAddress
		}
		eth := header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize))
		eth.Encode(&header.EthernetFields{Type: pkt.NetworkProtocolNumber, SrcAddr: src, DstAddr: pkt.EgressRoute.RemoteLinkAddress})
		if arp := header.ARP(pkt.NetworkHeader().Slice()); pkt.NetworkProtocolNumber == header.ARPProtocolNumber &&
			arp.IsValid() && arp.Op() == header.ARPReply && !e.arpFor[[4]byte(arp.ProtocolAddressSender())] {
			n++
			continue // do not claim an address that is not ours
		}
		v := pkt.ToView()
		framed := make([]byte, 4+v.Size())
		binary.BigEndian.PutUint32(framed, uint32(v.Size()))
		copy(framed[4:], v.AsSlice())
		v.Release()
		e.out(framed)
		n++
	}
	return n, nil
}

// port moves Ethernet frames between QEMU's stream netdev and the gateway's
// endpoint. It stands in for gvisor-tap-vsock's tap.Switch, whose QEMU
// framing it speaks, but with one VM per network (a switch would also pass
// frames between guests), a bound on frame size (tap.Switch allocates
// whatever length the stream announces), frames filtered before the stack
// sees them, no log lines on a global logger, and writes that never block
// the stack: frames wait in a queue and are dropped when it is full, as a
// real NIC would drop them.
type port struct {
	n *Network

	mu sync.Mutex  // guards tx
	tx chan []byte // frames for the current connection; nil when none
}

// send queues one outbound frame (with its length prefix) for QEMU.
func (p *port) send(framed []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tx == nil {
		return
	}
	select {
	case p.tx <- framed:
	default: // queue full: drop
	}
}

// serve pumps frames until conn fails. It returns nil on a clean EOF.
func (p *port) serve(conn net.Conn) error {
	tx := make(chan []byte, txQueueLen)
	p.mu.Lock()
	p.tx = tx
	p.mu.Unlock()

	stopTx := make(chan struct{})
	txDone := make(chan struct{})
	go func() {
		defer close(txDone)
		for {
			select {
			case frame := <-tx:
				conn.SetWriteDeadline(time.Now().Add(txTimeout))
				if _, err := conn.Write(frame); err != nil {
					conn.Close() // a partial write breaks the framing
					return
				}
			case <-stopTx:
				return
			}
		}
	}()

	err := p.rx(conn)

	p.mu.Lock()
	p.tx = nil
	p.mu.Unlock()
	close(stopTx)
	conn.Close()
	<-txDone
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// rx reads frames from conn and delivers the acceptable ones to the stack.
func (p *port) rx(conn net.Conn) error {
	br := bufio.NewReaderSize(conn, 64<<10)
	var hdr [4]byte
	buf := make([]byte, maxFrame)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return err
		}
		size := binary.BigEndian.Uint32(hdr[:])
		if size > maxFrame {
			return fmt.Errorf("vmnet: frame of %d bytes from the VM (at most %d)", size, maxFrame)
		}
		frame := buf[:size]
		if _, err := io.ReadFull(br, frame); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		proto, ok := acceptFrame(frame)
		if !ok {
			continue
		}
		p.n.link.deliver(proto, frame[header.EthernetMinimumSize:])
	}
}

var (
	gatewayLinkAddr = func() tcpip.LinkAddress {
		mac, err := net.ParseMAC(gatewayMAC)
		if err != nil {
			panic(err)
		}
		return tcpip.LinkAddress(mac)
	}()
	guestAddr4  = guestAddr.As4()
	subnetBcast = [4]byte{192, 168, 127, 255}
)

// acceptFrame decides whether a frame from the guest reaches the gateway's
// stack: ARP, and IPv4 TCP or UDP from GuestIP to a unicast address, sent
// to the gateway's MAC (or broadcast, for ARP). Everything else (ICMP,
// IPv6, spoofed sources, multicast and broadcast datagrams) is dropped.
func acceptFrame(frame []byte) (tcpip.NetworkProtocolNumber, bool) {
	if len(frame) < header.EthernetMinimumSize {
		return 0, false
	}
	eth := header.Ethernet(frame)
	dst := eth.DestinationAddress()
	proto := eth.Type()
	ip := frame[header.EthernetMinimumSize:]
	switch proto {
	case header.ARPProtocolNumber:
		ok := (dst == gatewayLinkAddr || dst == header.EthernetBroadcastAddress) && header.ARP(ip).IsValid()
		return proto, ok
	case header.IPv4ProtocolNumber:
		if dst != gatewayLinkAddr || len(ip) < header.IPv4MinimumSize {
			return 0, false
		}
		h := header.IPv4(ip)
		if h.TransportProtocol() != header.TCPProtocolNumber && h.TransportProtocol() != header.UDPProtocolNumber {
			return 0, false
		}
		if h.SourceAddress().As4() != guestAddr4 {
			return 0, false
		}
		d := h.DestinationAddress().As4()
		if d[0] >= 224 || d == subnetBcast { // multicast, reserved, broadcast
			return 0, false
		}
		return proto, true
	}
	return 0, false
}
