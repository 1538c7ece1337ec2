package srt

import (
	"errors"
	"os"
	"path/filepath"
)

// systemBundle is the host's trust store (Debian's ca-certificates).
const systemBundle = "/etc/ssl/certs/ca-certificates.crt"

// caBundle writes the sandbox's trust store into the session directory:
// the system's certificates and the session CA's. It is no secret.
func caBundle(dir string, caPEM []byte) (*os.File, error) {
	system, err := os.ReadFile(systemBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	path := filepath.Join(dir, "ca-bundle.pem")
	data := append(append(system, '\n'), caPEM...)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return nil, err
	}
	return os.Open(path)
}
