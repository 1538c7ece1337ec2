package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	adminv1 "github.com/agentconnect-md/agentconnect/api/admin/v1"
	"github.com/agentconnect-md/agentconnect/internal/leftovers"
)

const shimIdle = 2 * time.Second

// benchShimMemory starts sessions running `sleep 600`, lets their shims go
// idle, and reads each shim's RSS and PSS from /proc/PID/smaps_rollup (the
// pid from `session show --json`). It also breaks the first shim's RSS down
// by mapping, to show what dominates it.
func benchShimMemory(ctx context.Context, d *daemon, c counts, rep *report) error {
	a, err := d.dialAdmin()
	if err != nil {
		return err
	}
	defer a.Close()
	sessions, err := startSessions(ctx, a, c.Shims, sleepCommand)
	defer func() {
		if rmErr := removeSessions(ctx, a, sessions); rmErr != nil {
			rep.Errors = append(rep.Errors, "idle shim memory: "+rmErr.Error())
		}
	}()
	if err != nil {
		return err
	}
	select {
	case <-time.After(shimIdle):
	case <-ctx.Done():
		return ctx.Err()
	}

	var rss, pss samples // kB
	var firstShim int
	for _, s := range sessions {
		out, stderr, code, err := d.cli(ctx, "session", "show", s.Id, "--json")
		if err != nil || code != 0 {
			return fmt.Errorf("session show %s: exit %d %v %s", s.Id, code, err, strings.TrimSpace(stderr))
		}
		var view struct {
			State   string `json:"state"`
			ShimPID int    `json:"shimPid"`
		}
		if err := json.Unmarshal([]byte(out), &view); err != nil {
			return fmt.Errorf("session show %s --json: %v", s.Id, err)
		}
		if view.State != "running" || view.ShimPID <= 0 {
			return fmt.Errorf("session %s: state %q, shimPid %d; want a running session with a shim", s.Id, view.State, view.ShimPID)
		}
		roll, err := readSmapsRollup(view.ShimPID)
		if err != nil {
			return err
		}
		rss = append(rss, float64(roll["Rss"]))
		pss = append(pss, float64(roll["Pss"]))
		if firstShim == 0 {
			firstShim = view.ShimPID
		}
	}
	const mib = 1024.0
	const m = "idle shim memory (sleep 600, after 2 s)"
	ref := fmt.Sprintf("%d shims; containerd 1.6 runc shim: 13.4 MB RSS, 3.6 MB PSS", len(rss))
	rep.add(m, "RSS mean", rss.mean()/mib, "MiB", 6, ref)
	rep.add(m, "RSS max", rss.max()/mib, "MiB", 6, "")
	rep.add(m, "PSS mean", pss.mean()/mib, "MiB", 0, "shared pages split between the live shims")
	rep.add(m, "PSS max", pss.max()/mib, "MiB", 0, "")

	if st, err := a.Status(ctx, &adminv1.StatusRequest{}); err == nil {
		if roll, err := readSmapsRollup(int(st.Pid)); err == nil {
			rep.add(m, "supervisor RSS", float64(roll["Rss"])/mib, "MiB", 0, fmt.Sprintf("the daemon, with %d sessions", st.Sessions))
		}
		var spRSS, spPSS samples // kB
		for _, p := range leftovers.ReadProcs() {
			if p.PPID == int(st.Pid) && p.Spare() {
				if roll, err := readSmapsRollup(p.PID); err == nil {
					spRSS = append(spRSS, float64(roll["Rss"]))
					spPSS = append(spPSS, float64(roll["Pss"]))
				}
			}
		}
		if len(spRSS) > 0 {
			rep.add(m, "spare shim RSS / PSS", spRSS.mean()/mib, "MiB", 0, fmt.Sprintf("%d spares waiting beside the daemon for cold starts; PSS %.2f MiB each", len(spRSS), spPSS.mean()/mib))
		}
	}

	parts, err := smapsBreakdown(firstShim)
	if err != nil {
		return err
	}
	const b = "shim RSS by mapping (one shim)"
	for _, p := range parts {
		rep.add(b, p.name, float64(p.rss)/mib, "MiB", 0, p.note)
	}
	return nil
}

// readSmapsRollup returns the kB fields of /proc/PID/smaps_rollup.
func readSmapsRollup(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fields := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			fields[k] = n
		}
	}
	return fields, sc.Err()
}

type mappingPart struct {
	name string
	rss  int64 // kB
	note string
}

// smapsBreakdown sums a process's RSS by what is mapped: each file, the
// heap, the stacks, anonymous memory (where the Go heap and goroutine
// stacks live).
func smapsBreakdown(pid int) ([]mappingPart, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type acc struct{ rss, anon, dirty int64 }
	byName := map[string]*acc{}
	var cur *acc
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") && strings.Contains(fields[0], "-") {
			// A mapping header: address perms offset dev inode [path].
			name := "anonymous (Go heap, stacks)"
			if len(fields) >= 6 {
				name = strings.Join(fields[5:], " ")
				if !strings.HasPrefix(name, "[") {
					name = filepath.Base(name) + " " + fields[1]
				}
			}
			if byName[name] == nil {
				byName[name] = &acc{}
			}
			cur = byName[name]
			continue
		}
		if cur == nil || len(fields) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "Rss:":
			cur.rss += n
		case "Anonymous:":
			cur.anon += n
		case "Private_Dirty:":
			cur.dirty += n
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var parts []mappingPart
	other := mappingPart{name: "other"}
	for name, a := range byName {
		if a.rss == 0 {
			continue
		}
		if a.rss < 64 {
			other.rss += a.rss
			other.note += name + " "
			continue
		}
		kind := ""
		switch {
		case strings.HasSuffix(name, " r-xp"):
			kind = "code; "
		case strings.HasPrefix(name, "agentconnect-shim r--p"):
			kind = "read-only data (Go rodata, pclntab, type info); "
		case strings.HasSuffix(name, " r--p"):
			kind = "read-only data; "
		case strings.HasSuffix(name, " rw-p"):
			kind = "data, bss; "
		}
		parts = append(parts, mappingPart{name: name, rss: a.rss,
			note: fmt.Sprintf("%s%d kB anonymous, %d kB private dirty", kind, a.anon, a.dirty)})
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].rss > parts[j].rss })
	if other.rss > 0 {
		other.note = "under 64 kB each: " + strings.TrimSpace(other.note)
		parts = append(parts, other)
	}
	return parts, nil
}
