// Command chaos churns sessions across host, srt and microsandbox while it
// breaks things: it SIGKILLs and restarts the supervisor at random moments,
// kills shims and runtimes, races a stop with a start, and fills the home's
// disk to ENOSPC once (a loop filesystem it makes) and frees it again. After
// every round it checks the daemon's promises and stops at the first one
// broken, with a report that names the round, its faults and the seed:
//
//   - no session's output loses or repeats a byte;
//   - every exit code is right, and every session whose shim died is lost
//     with a reason;
//   - nothing of a removed session is left: process, mount, cgroup, shim
//     socket, VM socket directory, session directory;
//   - every state file parses, every output log reads whole;
//   - the admin API answers within adminBound.
//
// make chaos runs it (root: the loop filesystem and cgroups need it) under a
// child subreaper, as this machine's PID 1 does not reap. The same seed
// makes the same plan; the moments faults land on are the machine's.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/agentconnect-md/agentconnect/internal/reaper"
)

const reapedEnv = "AGENTCONNECT_CHAOS_REAPED"

var (
	flagSeed     = flag.Uint64("seed", 0, "the plan's random `SEED` (default: from the clock; printed either way)")
	flagDuration = flag.Duration("duration", 8*time.Minute, "start no round after this `DURATION` (a round in flight finishes)")
	flagVMEvery  = flag.Int("vm-every", 3, "a microsandbox session in every `N`th round (0: none)")
	flagWarm     = flag.Int("warm", 1, "every agent keeps `N` warm boundaries (for microsandbox, booted VMs), built, claimed and discarded under the faults too")
	flagKeep     = flag.Bool("keep", false, "on failure, leave the daemon, its home and the loop filesystem as they are, to look at")
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: AGENTCONNECT_BIN=DIR go run ./chaos [flags] (make chaos [SEED=N] [CHAOS_DURATION=8m])\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "chaos: needs root: it mounts a loop filesystem for the daemon's home and the sessions need cgroups")
		os.Exit(2)
	}
	if os.Getenv(reapedEnv) == "" {
		code, err := reaper.Reexec(reapedEnv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			os.Exit(1)
		}
		os.Exit(code)
	}
	os.Exit(run())
}

func run() int {
	binDir := os.Getenv("AGENTCONNECT_BIN")
	if binDir == "" {
		fmt.Fprintln(os.Stderr, "chaos: set AGENTCONNECT_BIN to the directory holding agentconnect and its shims (make build puts them in bin/)")
		return 2
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) % 1_000_000_000
	}
	fmt.Printf("chaos: seed %d (the same plan again: make chaos SEED=%d); rounds for %v\n", seed, seed, *flagDuration)

	c := &chaos{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), seed: seed, bin: binDir}
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-interrupted
		c.interrupt.Store(true)
		fmt.Println("chaos: interrupted; the round in flight ends, then everything is cleaned up")
	}()

	if err := c.setUp(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: set up:", err)
		c.tearDown(false)
		return 1
	}
	start := time.Now()
	failure := c.rounds(start.Add(*flagDuration))
	if failure == "" {
		failure = c.finish()
	}
	if failure != "" {
		fmt.Printf("\nchaos: FAILED (seed %d, after %v)\n%s\n", seed, time.Since(start).Round(time.Second), failure)
		if tail := c.daemonLogTail(40); tail != "" {
			fmt.Printf("\nthe daemon's log, last lines:\n%s\n", tail)
		}
		if *flagKeep {
			fmt.Printf("\nkept: home %s (the daemon pid %d still runs; umount %s when done)\n", c.home, c.daemonPID(), c.loop.mnt)
			return 1
		}
		c.tearDown(true)
		return 1
	}
	if problem := c.tearDown(true); problem != "" {
		fmt.Printf("\nchaos: FAILED at the end (seed %d): %s\n", seed, problem)
		return 1
	}
	fmt.Printf("\nchaos: passed: %d rounds in %v, %s; seed %d\n", c.round, time.Since(start).Round(time.Second), c.totals(), seed)
	return 0
}

// totals sums what the rounds did, for the last line.
func (c *chaos) totals() string {
	var parts []string
	for _, k := range []string{"sessions", "sessions on a warm boundary", "supervisor SIGKILLs", "shims killed", "runtimes killed", "stops racing starts", "starts refused on a full disk", "starts whose answer a SIGKILL took"} {
		if n := c.count[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	return strings.Join(parts, ", ")
}
