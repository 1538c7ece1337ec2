package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Names that tools on the host trust and run, made read-only in every
// writable root, and kept from being created where they are absent: a
// runtime that planted one would run code outside its boundary the next time
// a host tool (git, a shell, an editor, an MCP client) read it.
var (
	protectedFiles = []string{
		".gitconfig", ".gitmodules", // git runs what they name
		".bashrc", ".bash_profile", ".zshrc", ".zprofile", ".profile", // shells source them
		".mcp.json", // MCP clients start the servers it lists
	}
	protectedDirs = []string{
		".vscode", ".idea", // editors run their tasks
		".claude/commands", ".claude/agents", // Claude Code runs them
	}
)

// The parts of a git directory that make git run code: hooks, config (hook
// paths, filters, aliases, fsmonitor), and the files that redirect to
// another git directory or add config.
var gitProtected = []string{"hooks", "config", "config.worktree", "commondir"}

// Bounds on looking for nested repositories in a writable root: deep enough
// for a monorepo's packages, shallow and small enough to cost little at
// every start.
const (
	scanDepth    = 3
	scanMaxDirs  = 5000
	skipScanning = "node_modules"
)

// protect makes the protected names of one writable root read-only, with
// placeholders where they are absent. In the runtime's home an absent file
// becomes an empty read-only file (shells source their rc files from it); in
// other roots, an empty read-only directory, which git ignores, so that a
// repository's status does not change while the session runs.
func (b *builder) protect(root string, isHome bool) error {
	for _, name := range protectedFiles {
		if err := b.protectPath(root, filepath.Join(root, name), !isHome); err != nil {
			return err
		}
	}
	for _, name := range protectedDirs {
		if err := b.protectPath(root, filepath.Join(root, name), true); err != nil {
			return err
		}
	}
	gitDirs, err := findGitDirs(root)
	if err != nil {
		return err
	}
	for _, g := range gitDirs {
		if err := b.protectGitDir(g, root); err != nil {
			return err
		}
	}
	return nil
}

// protectPath binds p, inside root, read-only onto itself, or puts a
// placeholder there when it is absent: an empty read-only directory (asDir)
// or an empty read-only file.
func (b *builder) protectPath(root, p string, asDir bool) error {
	// A mount on a path through a symlink would land where the symlink
	// points, and the symlink could be swapped: none may be on the way.
	for q := filepath.Dir(p); q != root && within(root, q); q = filepath.Dir(q) {
		if fi, err := os.Lstat(q); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%s is a symlink, so %s cannot be made read-only: replace it with the directory it points to", q, p)
		}
	}
	fi, err := os.Lstat(p)
	switch {
	case err == nil && fi.Mode()&os.ModeSymlink != 0:
		// A mount cannot be put on a symlink (it would land on the target),
		// so the name could be replaced: refuse rather than run unprotected.
		return fmt.Errorf("%s is a symlink, which cannot be made read-only: replace it with the file or directory it points to", p)
	case err == nil:
		b.add("--ro-bind", p, p)
	case os.IsNotExist(err):
		b.placeholder(p, asDir)
	default:
		return err
	}
	return nil
}

// placeholder keeps an absent path from being created: an empty read-only
// directory, or an empty read-only file. bwrap makes the mount point on the
// host; RemovePlaceholders deletes it after the run, along with the parents
// it had to make.
func (b *builder) placeholder(p string, asDir bool) {
	for parent := filepath.Dir(p); ; parent = filepath.Dir(parent) {
		if _, err := os.Lstat(parent); err == nil {
			break
		}
		b.placeholders = append(b.placeholders, parent)
	}
	b.placeholders = append(b.placeholders, p)
	switch {
	case !asDir && b.emptyFile != "":
		b.add("--ro-bind", b.emptyFile, p)
	case b.emptyDir != "":
		b.add("--ro-bind", b.emptyDir, p)
	default:
		b.add("--tmpfs", p, "--remount-ro", p)
	}
}

// protectGitDir protects one git directory found in root. The directory
// itself is bound onto itself first, so that it is a mount point: renaming
// it away (mv .git .git2 && mkdir .git) fails.
func (b *builder) protectGitDir(gitDir, root string) error {
	b.add("--bind", gitDir, gitDir)
	for _, name := range gitProtected {
		p := filepath.Join(gitDir, name)
		if _, err := os.Lstat(p); os.IsNotExist(err) && (name == "config.worktree" || name == "commondir") {
			continue // git reads an empty placeholder of these as a broken repository
		}
		if err := b.protectPath(root, p, name == "hooks"); err != nil {
			return err
		}
	}
	return nil
}

// findGitDirs finds the git directories of root: root/.git and those of
// repositories nested a few levels down, submodules' (.git/modules/...),
// worktrees' (.git/worktrees/...), and those a .git file points to, when
// they are inside root.
func findGitDirs(root string) ([]string, error) {
	var found []string
	seen := map[string]bool{}
	var addGitDir func(string)
	addGitDir = func(g string) {
		if seen[g] || !within(root, g) {
			return
		}
		seen[g] = true
		found = append(found, g)
		for _, sub := range []string{"modules", "worktrees"} {
			entries, _ := os.ReadDir(filepath.Join(g, sub))
			for _, e := range entries {
				if e.IsDir() {
					addGitDir(filepath.Join(g, sub, e.Name()))
				}
			}
		}
	}
	visited := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		visited++
		if visited > scanMaxDirs {
			return nil
		}
		dotGit := filepath.Join(dir, ".git")
		if fi, err := os.Lstat(dotGit); err == nil {
			switch {
			case fi.IsDir():
				addGitDir(dotGit)
			case fi.Mode().IsRegular():
				if g := gitFileTarget(dotGit); g != "" {
					addGitDir(g)
				}
			}
		}
		if depth == scanDepth {
			return nil
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil // unreadable: nothing of it to protect
		}
		for _, e := range entries {
			if e.IsDir() && e.Name() != ".git" && e.Name() != skipScanning {
				if err := walk(filepath.Join(dir, e.Name()), depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return found, walk(root, 0)
}

// gitFileTarget reads a .git file ("gitdir: PATH") and returns the git
// directory it names, resolved against the file's directory.
func gitFileTarget(file string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return ""
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "gitdir:")
	if !ok {
		return ""
	}
	p = strings.TrimSpace(p)
	if !filepath.IsAbs(p) {
		p = filepath.Join(filepath.Dir(file), p)
	}
	return filepath.Clean(p)
}
