// Package vmtransport carries the connections between a session's shim and
// its guest agent, over vsock or as yamux streams on a virtio-serial port;
// every connection starts with a one-line preface naming what it carries.
//
// # Connections
//
// The host opens every connection; the guest agent accepts. The first line
// of each is its preface (WritePreface, ReadPreface):
//
//	ttrpc\n            the vmagent API (api/vmagent/v1), one or more per host
//	stdin ID\n         raw bytes for process ID's stdin; the host's close is its end of file
//	stdout ID\n        raw bytes of process ID's stdout, closed by the guest after the last
//	stderr ID\n        likewise for stderr
//
// IDs match CheckID. The stdio connections of a process are opened before
// its Exec, which names them (ExecRequest.stdin/stdout/stderr) so that the
// agent waits for any whose preface it has not read yet. A malformed
// preface gets the connection closed.
//
// # Vsock
//
// The guest listens on a vsock port (DefaultPort unless the kernel command
// line says agentconnect.port=) for any CID: ListenVsock. The host dials
// the guest's CID (DialVsock, VsockDialer) and retries while the guest boots
// (DialWithRetry). Without /dev/vhost-vsock on the host the error wraps
// ErrNoVsock.
//
// # Serial
//
// Where vsock is impossible, one virtio-serial port carries everything: QEMU
// gets -chardev socket,id=agent,path=SOCK,server=on,wait=off -device
// virtserialport,chardev=agent,name=agentconnect (SerialPortName), the
// guest finds /dev/vportNpM by that name (FindSerialPort) and serves
// (ListenSerial); the host connects to SOCK (NewSerialClient) and opens a
// yamux stream per connection (SerialClient.Dial).
//
// Before yamux starts, the host writes a hello line and the guest answers
// with its own once it serves; each side skips whatever precedes the other's
// hello, since a port keeps bytes of an earlier session across a reconnect.
// NewSerialClient therefore returns once the guest agent is up. Yamux pings
// every 10 s and ends a session whose peer has not answered within 20 s
// (WithKeepAlive); SerialClient.Done tells the host. When the host goes
// away the guest reopens the port, waits for the host to connect again and
// starts a new session: a shim can restart and reconnect, while the
// processes keep running (their output meanwhile is lost).
package vmtransport
