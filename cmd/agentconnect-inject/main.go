// Command agentconnect-inject serves one session's tunnels to the hosts its
// secrets are bound to (package inject): its shim starts it for a session
// with secret bindings, writes the secrets on its stdin (never argv or env),
// reads the session CA's certificate from its stdout, and hands it each
// tunnel on fd 3 (package handoff). It dials nothing and resolves nothing:
// the shim's proxy did both under the session's policy. It is a binary of
// its own because net/http and crypto/tls would cost every shim 1 MiB of
// memory (docs/design-notes.md).
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentconnect-md/agentconnect/internal/inject"
	"github.com/agentconnect-md/agentconnect/internal/inject/handoff"
)

const handoffFD = 3

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintln(os.Stderr, "usage: agentconnect-inject < CONFIG.json (its shim starts it; a person does not need to)")
		os.Exit(2)
	}
	// It holds secrets' values.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "agentconnect-inject:", err)
		os.Exit(1)
	}
}

func run() error {
	data, err := io.ReadAll(io.LimitReader(os.Stdin, 4<<20))
	if err != nil {
		return fmt.Errorf("read the config: %w", err)
	}
	var cfg handoff.Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return errors.New("the config on stdin is not JSON") // the decoder's message could quote a value
	}
	icfg := inject.Config{
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) },
		// A renewed token goes to the shim, which keeps it for the store.
		OnUpdate: func(placeholder, value string) {
			if err := handoff.SendUpdate(handoffFD, handoff.Update{Placeholder: placeholder, Value: value}); err != nil {
				fmt.Fprintf(os.Stderr, "a renewed secret could not reach the shim: %v\n", err)
			}
		},
	}
	if cfg.RootCAsPEM != "" {
		// Besides the system's store, not instead of it.
		if icfg.RootCAs, err = x509.SystemCertPool(); err != nil {
			icfg.RootCAs = x509.NewCertPool()
		}
		if !icfg.RootCAs.AppendCertsFromPEM([]byte(cfg.RootCAsPEM)) {
			return errors.New("rootCAsPEM holds no certificate")
		}
	}
	for _, s := range cfg.Secrets {
		icfg.Secrets = append(icfg.Secrets, inject.Secret(s))
	}
	in, err := inject.New(icfg)
	if err != nil {
		return err
	}
	if err := json.NewEncoder(os.Stdout).Encode(handoff.Ready{CACertPEM: string(in.CACertPEM())}); err != nil {
		return err
	}
	os.Stdout.Close()
	ctx := context.Background()
	for {
		t, client, upstream, err := handoff.Receive(handoffFD)
		if errors.Is(err, handoff.ErrClosed) {
			return nil // the shim is gone: so is the session
		}
		if err != nil {
			return err
		}
		go in.Intercept(ctx, client, t.Buffered, upstream, t.Hosts, t.Port)
	}
}
