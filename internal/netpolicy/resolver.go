package netpolicy

import (
	"context"
	"net"
)

// Resolver is the DNS a boundary's network asks for the names its runtime
// connects to: the server ("IP:port"), or the system's when it is "".
func Resolver(server string) *net.Resolver {
	if server == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, server)
	}}
}
