package srt

import (
	"errors"
	"os"
	"path/filepath"
)

// systemBundle is the host's trust store (Debian's ca-certificates).
const systemBundle = "/etc/ssl/certs/ca-certificates.crt"

// caBundleName is the sandbox's trust store in the session directory.
const caBundleName = "ca-bundle.pem"

// caBundle writes the sandbox's trust store into the session directory,
// the system's certificates, and opens it for the boundary to bind. It is
// no secret. A run with secrets appends its session CA (addCA) before the
// runtime starts: the bind shows the same file.
func caBundle(dir string) (*os.File, error) {
	system, err := os.ReadFile(systemBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	path := filepath.Join(dir, caBundleName)
	if err := os.WriteFile(path, append(system, '\n'), 0o644); err != nil {
		return nil, err
	}
	return os.Open(path)
}

// addCA appends the session CA's certificate to the trust store caBundle
// wrote in dir.
func addCA(dir string, caPEM []byte) error {
	f, err := os.OpenFile(filepath.Join(dir, caBundleName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(caPEM)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
