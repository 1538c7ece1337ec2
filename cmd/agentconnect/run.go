package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	shimv1 "github.com/agentconnect-md/agentconnect/api/shim/v1"
	"github.com/agentconnect-md/agentconnect/internal/fds"
	"github.com/agentconnect-md/agentconnect/internal/home"
	"github.com/agentconnect-md/agentconnect/internal/procstat"
	"github.com/agentconnect-md/agentconnect/internal/version"
	"github.com/agentconnect-md/agentconnect/supervisor"
)

// envLockFD names the fd of the home lock a restarting daemon hands over.
const envLockFD = "AGENTCONNECT_LOCK_FD"

// The fds a restarting daemon hands over: the admin socket where socket
// activation puts it, and the home lock after it.
const (
	handoverListenerFD = 3
	handoverLockFD     = 4
)

func newRunCommand(g *globals) *cobra.Command {
	var configPath string
	var requireSandbox bool
	var startTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the daemon in the foreground",
		Long: `Run the daemon in the foreground: the admin API, the agents and their sessions.

Sessions run in their own shims and survive the daemon: stopping, killing or
restarting it never ends a session, and a new daemon adopts them.

SIGHUP restarts the daemon in place (the same arguments, the same admin socket);
SIGTERM and SIGINT stop it. Under systemd the admin socket may come from socket
activation, and the daemon reports ready after it has adopted its sessions.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDaemon(g, configPath, requireSandbox, startTimeout)
		},
	}
	cmd.Flags().StringVar(&configPath, "config", "", "the config file (default <home>/config.json)")
	cmd.Flags().BoolVar(&requireSandbox, "require-sandbox", false, "turn host off: refuse sessions without a sandbox (fail-closed)")
	// For tests: a start that times out for real, without waiting minutes.
	cmd.Flags().DurationVar(&startTimeout, "start-timeout", 0, "bound a session start's call to its shim (default: longer than the shim's own bound)")
	cmd.Flags().MarkHidden("start-timeout")
	return cmd
}

func newLogger() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	if os.Getenv("INVOCATION_ID") != "" || os.Getenv("JOURNAL_STREAM") != "" {
		log.SetFormatter(&logrus.JSONFormatter{})
	} else {
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	}
	return log
}

func runDaemon(g *globals, configPath string, requireSandbox bool, startTimeout time.Duration) error {
	fds.CloseOnExec()
	// The supervisor starts its shims as its children, and a re-exec
	// (SIGHUP, restart) keeps this pid: the shims of the image before are
	// children of this one, which reaps them once they exit. Nothing else
	// of this image has started a process yet.
	for _, pid := range procstat.Children(os.Getpid()) {
		shimv1.Reap(pid)
	}
	layout, err := g.layout()
	if err != nil {
		return err
	}
	if configPath != "" {
		if configPath, err = filepath.Abs(configPath); err != nil {
			return err
		}
	}
	if err := layout.Create(); err != nil {
		return err
	}
	lock, err := takeLock(layout)
	if err != nil {
		return err
	}
	listener, err := inheritedListener()
	if err != nil {
		return err
	}
	shimBinary, err := findShim("agentconnect-shim")
	if err != nil {
		return err
	}
	// Without these microsandbox is unavailable, and says why.
	vmShimBinary, _ := findShim("agentconnect-shim-vm")
	vmImageBinary, _ := findShim("agentconnect-vmimage")
	log := newLogger()

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		sig := <-signals
		log.WithField("signal", sig).Info("signal received")
		if sig == syscall.SIGHUP {
			cancel(supervisor.ErrRestart)
			return
		}
		cancel(context.Canceled)
	}()

	handover, err := supervisor.Run(ctx, supervisor.Options{
		Home: layout.Root, ConfigPath: configPath, RequireSandbox: requireSandbox,
		ShimBinary: shimBinary, VMShimBinary: vmShimBinary, VMImageBinary: vmImageBinary, ImageDir: findImageDir(), Listener: listener, Lock: lock, Args: os.Args, Log: log,
		StartTimeout: startTimeout,
		Ready:        func() { daemon.SdNotify(false, daemon.SdNotifyReady) },
	})
	if err != nil {
		return err
	}
	if handover != nil {
		log.WithField("args", strings.Join(os.Args, " ")).Info("re-executing")
		return reexec(handover.Listener, lock)
	}
	return nil
}

// takeLock takes the home lock, or takes back the one a restart handed over.
func takeLock(layout home.Layout) (*os.File, error) {
	if v := os.Getenv(envLockFD); v != "" {
		os.Unsetenv(envLockFD)
		fd, err := strconv.Atoi(v)
		if err == nil && sameFile(fd, layout.LockPath()) {
			f := os.NewFile(uintptr(fd), layout.LockPath())
			unix.CloseOnExec(fd)
			// Still ours: flock on the same open file succeeds.
			if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
				return f, nil
			}
			f.Close()
		}
	}
	return layout.Lock()
}

func sameFile(fd int, path string) bool {
	var a, b unix.Stat_t
	return unix.Fstat(fd, &a) == nil && unix.Stat(path, &b) == nil && a.Dev == b.Dev && a.Ino == b.Ino
}

// inheritedListener is the admin socket systemd or a restart passed in
// (LISTEN_FDS), or nil.
func inheritedListener() (net.Listener, error) {
	ls, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	for _, l := range ls {
		if l != nil {
			return l, nil
		}
	}
	return nil, nil
}

// findShim finds a shim binary (agentconnect-shim, agentconnect-shim-vm)
// beside this binary, else on PATH.
func findShim(name string) (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is neither beside agentconnect nor on PATH: install them together (make install)", name)
	}
	return p, nil
}

// findImageDir is where the default microsandbox image is: beside the
// binary (make image puts it in bin/image), or where make install puts it
// (PREFIX/share/agentconnect/image).
func findImageDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "/usr/local/share/agentconnect/image"
	}
	dir := filepath.Dir(exe)
	for _, d := range []string{filepath.Join(dir, "image"), filepath.Join(dir, "..", "share", "agentconnect", "image")} {
		if _, err := os.Stat(filepath.Join(d, "image.json")); err == nil {
			return d
		}
	}
	return filepath.Join(dir, "..", "share", "agentconnect", "image")
}

// reexec replaces this process with a new daemon of the same arguments,
// handing over the admin socket (as socket activation would) and the lock.
// It returns only on failure.
func reexec(listener, lock *os.File) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	// Move the two files to fds 3 and 4 through fds above them, so that
	// neither overwrites the other, and let them survive exec.
	l, err := unix.FcntlInt(listener.Fd(), unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	k, err := unix.FcntlInt(lock.Fd(), unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := unix.Dup3(l, handoverListenerFD, 0); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := unix.Dup3(k, handoverLockFD, 0); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LISTEN_") && !strings.HasPrefix(kv, envLockFD+"=") {
			env = append(env, kv)
		}
	}
	env = append(env, "LISTEN_FDS=1", "LISTEN_PID="+strconv.Itoa(os.Getpid()), "LISTEN_FDNAMES=admin",
		envLockFD+"="+strconv.Itoa(handoverLockFD))
	err = syscall.Exec(exe, os.Args, env)
	return fmt.Errorf("restart: exec %s: %w (version %s)", exe, err, version.Version)
}
