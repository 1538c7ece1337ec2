package protect

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Finding is something a run wrote that a host tool would run: a hook or a
// config setting of a repository the run created. The run could write it
// (the repository did not exist when its boundary was built, so nothing
// protected it); the person who runs git there next should know first.
type Finding struct {
	Path   string // on the host
	Reason string
}

// benignConfig are the settings git itself writes (init, clone, remote add,
// branch --set-upstream) that make git run nothing. Any other key in a new
// repository's config is reported: hooksPath, fsmonitor, sshCommand, pager,
// editor, filters, diff drivers, aliases, includes, credential helpers...
var benignConfig = map[string]bool{
	"core.repositoryformatversion": true, "core.filemode": true, "core.bare": true,
	"core.logallrefupdates": true, "core.ignorecase": true, "core.precomposeunicode": true,
	"core.symlinks": true, "core.autocrlf": true, "core.eol": true, "core.safecrlf": true,
	"user.name": true, "user.email": true, "init.defaultbranch": true,
	"extensions.objectformat": true, "extensions.worktreeconfig": true,
	"remote.*.url": true, "remote.*.fetch": true, "remote.*.pushurl": true,
	"branch.*.remote": true, "branch.*.merge": true, "branch.*.rebase": true,
	"submodule.*.url": true, "submodule.*.active": true,
}

// Audit reports, at the end of the run, the hooks and config settings of the
// git directories in the plan's roots that it did not protect: those the run
// created.
func (p *Plan) Audit() []Finding {
	var out []Finding
	found, errs := scanRoots(p.roots, nil)
	for i, r := range p.roots {
		if errs[i] != nil {
			out = append(out, Finding{Path: r.Host, Reason: errs[i].Error()})
		}
		for _, rel := range found[i] {
			g := filepath.Join(r.Host, rel)
			if p.protects(r, rel) {
				continue
			}
			dir := filepath.Join(procPath(r.Dir), rel)
			out = append(out, auditHooks(dir, g)...)
			for _, name := range []string{"config", "config.worktree"} {
				out = append(out, auditConfig(r, filepath.Join(rel, name), filepath.Join(g, name))...)
			}
			if fi, err := os.Lstat(filepath.Join(dir, "commondir")); err == nil && fi.Mode().IsRegular() {
				out = append(out, Finding{Path: filepath.Join(g, "commondir"), Reason: "git directory redirected by commondir, written during the session"})
			} else {
				out = append(out, notRegular(r, filepath.Join(rel, "commondir"), filepath.Join(g, "commondir"))...)
			}
		}
	}
	return out
}

// auditHooks reports every hook that is not one of git's samples.
func auditHooks(gitDir, shown string) []Finding {
	entries, err := os.ReadDir(filepath.Join(gitDir, "hooks"))
	if err != nil {
		return nil
	}
	var out []Finding
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sample") && e.Type().IsRegular() {
			continue
		}
		out = append(out, Finding{Path: filepath.Join(shown, "hooks", e.Name()), Reason: "git hook written during the session"})
	}
	return out
}

// notRegular reports the file at rel in r when it is there but not a
// regular file: git follows a symlinked config or commondir, which the
// audit does not read through.
func notRegular(r Root, rel, shown string) []Finding {
	var st unix.Stat_t
	if unix.Fstatat(int(r.Dir.Fd()), rel, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT == unix.S_IFREG {
		return nil
	}
	return []Finding{{Path: shown, Reason: "not a regular file (a symlink git follows, say), made during the session"}}
}

// maxConfigRead bounds reading a config: a real one is a few hundred bytes.
const maxConfigRead = 64 << 10

// auditConfig reports the settings of a config file that are not benign.
func auditConfig(r Root, rel, shown string) []Finding {
	if f := notRegular(r, rel, shown); f != nil {
		return f
	}
	f, err := openRegular(r.Dir, rel)
	if err != nil {
		return nil
	}
	defer f.Close()
	keys := configKeys(io.LimitReader(f, maxConfigRead))
	var bad []string
	for _, k := range keys {
		if !benignConfig[k] {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	return []Finding{{Path: shown, Reason: fmt.Sprintf("git config written during the session sets %s", strings.Join(bad, ", "))}}
}

// configKeys lists the keys a git config file sets, as section.name or
// section.*.name for a section with a subsection, lowercased. It reads the
// common form git writes ([section] or [section "sub"], then name = value
// lines); a line it cannot read is reported as a key of its own, so that
// nothing unusual passes silently.
func configKeys(r io.Reader) []string {
	var keys []string
	seen := map[string]bool{}
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	section := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxConfigRead)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			end := strings.IndexByte(line, ']')
			if end < 0 {
				add("unreadable line " + fmt.Sprintf("%q", line))
				continue
			}
			head := line[1:end]
			name, sub, hasSub := strings.Cut(head, " ")
			section = strings.ToLower(strings.TrimSpace(name))
			if hasSub && strings.TrimSpace(sub) != "" {
				section += ".*"
			} else if i := strings.IndexByte(section, '.'); i >= 0 {
				section = section[:i] + ".*" // the old [section.sub] form
			}
			rest := strings.TrimSpace(line[end+1:])
			if rest == "" || rest[0] == '#' || rest[0] == ';' {
				continue
			}
			line = rest
		}
		name, _, _ := strings.Cut(line, "=")
		name = strings.ToLower(strings.TrimSpace(name))
		if section == "" || name == "" {
			add("unreadable line " + fmt.Sprintf("%q", line))
			continue
		}
		add(section + "." + name)
	}
	return keys
}
