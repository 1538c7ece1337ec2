package vmagent

import (
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	vmagentv1 "github.com/agentconnect-md/agentconnect/api/vmagent/v1"
)

// FuzzCheckSetup: any Setup request the host could send is planned or
// refused, never a panic; a plan has three different disk serials of the
// allowed form, share tags and targets that are unique, absolute, clean,
// and neither the root nor inside /proc, /sys or /dev.
func FuzzCheckSetup(f *testing.F) {
	good := &vmagentv1.SetupRequest{
		Root: &vmagentv1.Disk{Serial: "root", Readonly: true}, Upper: &vmagentv1.Disk{Serial: "upper"}, Docker: &vmagentv1.Disk{Serial: "docker"},
		Shares:  []*vmagentv1.Share{{Tag: "workspace", Target: "/home/u/ws"}, {Tag: "ro", Target: "/data", Readonly: true}},
		Network: &vmagentv1.Network{Address: "192.168.127.2/24", Gateway: "192.168.127.1", Hostname: "sandbox"},
		Entropy: make([]byte, 32), TimeUnixNano: 1,
	}
	for _, req := range []*vmagentv1.SetupRequest{good,
		{Root: &vmagentv1.Disk{Serial: "r"}, Upper: &vmagentv1.Disk{Serial: "r"}},
		{Root: &vmagentv1.Disk{Serial: "r"}, Upper: &vmagentv1.Disk{Serial: "u"}, Shares: []*vmagentv1.Share{{Tag: "t", Target: "/proc/x"}, {Tag: "t", Target: "/a/../b"}}},
		{Root: &vmagentv1.Disk{Serial: "r"}, Upper: &vmagentv1.Disk{Serial: "u"}, Network: &vmagentv1.Network{Address: "192.168.127.2/24", Gateway: "192.168.127.2", Hostname: "-x"}},
	} {
		b, _ := proto.Marshal(req)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req vmagentv1.SetupRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		plan, err := checkSetup(&req)
		if err != nil {
			return
		}
		serials := []string{plan.root, plan.upper, plan.docker}
		for i, s := range serials {
			if s == "" && i < 2 || s != "" && !serialPattern.MatchString(s) {
				t.Fatalf("planned disk serial %q", s)
			}
		}
		if plan.root == plan.upper || plan.docker != "" && (plan.docker == plan.root || plan.docker == plan.upper) {
			t.Fatalf("planned disks %q", serials)
		}
		tags, targets := map[string]bool{}, map[string]bool{}
		for _, s := range plan.shares {
			if !tagPattern.MatchString(s.tag) || tags[s.tag] || targets[s.target] {
				t.Fatalf("planned share %+v", s)
			}
			tags[s.tag], targets[s.target] = true, true
			if !filepath.IsAbs(s.target) || filepath.Clean(s.target) != s.target || s.target == "/" || checkResolvedTarget(s.target, s.target) != nil {
				t.Fatalf("planned share target %q", s.target)
			}
		}
	})
}

// FuzzCheckExec: any Exec the host could send is taken or refused, never
// a panic; one taken has a command, an absolute clean working directory,
// and KEY=VALUE entries without NUL bytes.
func FuzzCheckExec(f *testing.F) {
	f.Add("runtime", "node\x00main.js", "HOME=/home/agent\x00PATH=/usr/bin", "/home/agent/ws")
	f.Add("a b", "", "", "")
	f.Add("x", "sh", "=v", "rel")
	f.Fuzz(func(t *testing.T, id, args, env, cwd string) {
		split := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, "\x00")
		}
		spec, err := checkExec(id, split(args), split(env), cwd)
		if err != nil {
			return
		}
		if len(spec.args) == 0 || spec.args[0] == "" || !filepath.IsAbs(spec.cwd) || filepath.Clean(spec.cwd) != spec.cwd {
			t.Fatalf("taken exec %+v", spec)
		}
		for _, e := range spec.env {
			if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.ContainsRune(e, 0) {
				t.Fatalf("taken env entry %q", e)
			}
		}
	})
}
