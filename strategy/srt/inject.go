package srt

import (
	"errors"
	"io"
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
	path := filepath.Join(dir, caBundleName)
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	// Copied, not read whole: the store is ~200 KiB, which a shim's small
	// heap would otherwise keep for the run.
	if system, err := os.Open(systemBundle); err == nil {
		_, err = io.Copy(out, system)
		system.Close()
		if err != nil {
			out.Close()
			return nil, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		out.Close()
		return nil, err
	}
	_, err = out.WriteString("\n")
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
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
