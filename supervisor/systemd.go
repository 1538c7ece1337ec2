package supervisor

import (
	"os"
	"path/filepath"
	"strings"
)

// systemdUnit names the unit this daemon runs as, or "" when systemd did not
// start it, and whether it is a user unit (systemctl --user). systemd sets
// INVOCATION_ID for the processes of a unit; the unit is the last element of
// the process's cgroup path.
func systemdUnit() (unit string, user bool) {
	if os.Getenv("INVOCATION_ID") == "" {
		return "", false
	}
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (parts[1] != "name=systemd" && parts[0] != "0") {
			continue
		}
		p := parts[2]
		// A v2 daemon that moved into its leaf is one level down.
		if filepath.Base(p) == "supervisor" {
			p = filepath.Dir(p)
		}
		if unit := filepath.Base(p); strings.HasSuffix(unit, ".service") {
			return unit, strings.Contains(p, "/user@")
		}
	}
	return "", false
}
