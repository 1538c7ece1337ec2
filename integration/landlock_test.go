package integration

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestProbeWithoutLandlock: on a kernel without Landlock (here: under a
// seccomp filter answering landlock_create_ruleset with ENOSYS, as such a
// kernel does) srt is unavailable, and the reason says why and what to do.
func TestProbeWithoutLandlock(t *testing.T) {
	requireBwrap(t)
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.SYS_LANDLOCK_CREATE_RULESET, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	for _, ins := range prog {
		b := binary.LittleEndian.AppendUint16(nil, ins.Code)
		b = append(b, ins.Jt, ins.Jf)
		w.Write(binary.LittleEndian.AppendUint32(b, ins.K))
	}
	w.Close()
	defer r.Close()
	home := newHome(t)
	cmd := exec.Command("bwrap", "--dev-bind", "/", "/", "--seccomp", "3", "--", agentconnect(), "--home", home, "probe", "--json")
	cmd.ExtraFiles = []*os.File{r}
	out, _ := cmd.Output()
	var results []struct {
		Name      string `json:"name"`
		Available bool   `json:"available"`
		Reason    string `json:"reason"`
	}
	if err := json.Unmarshal(out, &results); err != nil {
		t.Fatalf("probe --json: %v: %s", err, out)
	}
	for _, res := range results {
		if res.Name == "srt" {
			if res.Available || !strings.Contains(res.Reason, "does not offer Landlock") || !strings.Contains(res.Reason, "CONFIG_SECURITY_LANDLOCK") {
				t.Errorf("srt without Landlock: available %v, reason %q; want unavailable, naming Landlock and the fix", res.Available, res.Reason)
			}
			return
		}
	}
	t.Errorf("probe lists no srt: %s", out)
}
