package custom

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// ownersByDebugfs makes the extraction leave owners, modes and device nodes
// to debugfs after mke2fs, as it must when not running as root (a test sets
// it to exercise that path as root).
var ownersByDebugfs = os.Geteuid() != 0

// buildRootfs flattens img into dir and makes the ext4 image out from it,
// returning out's size. dir is removed afterwards.
func buildRootfs(ctx context.Context, img v1.Image, dir, out string, logf func(string, ...any)) (int64, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	x, err := newExtractor(dir, ownersByDebugfs, logf)
	if err != nil {
		return 0, err
	}
	defer x.root.Close()
	rc := mutate.Extract(img)
	defer rc.Close()
	err = x.extract(ctx, tar.NewReader(rc))
	if err == nil {
		// mutate.Extract ends its tar stream before reporting a failure
		// (a layer that does not match its digest, say): the failure comes
		// after the end-of-archive marker.
		if _, err = io.Copy(io.Discard, rc); err != nil {
			err = fmt.Errorf("reading the image's layers: %w", err)
		}
	}
	if err != nil {
		return 0, err
	}
	if err := x.finish(); err != nil {
		return 0, err
	}

	// Room for the files, their metadata and a little more; no journal: the
	// root is shared read-only by the VMs that boot it.
	const mib = 1 << 20
	inodes := x.inodes + x.inodes/10 + 1024
	size := x.bytes + x.bytes/10 + inodes*256 + 16*mib
	size = (size + mib - 1) / mib * mib
	for attempt := 1; ; attempt++ {
		if err := os.WriteFile(out, nil, 0o644); err != nil { // mke2fs is quieter with an existing file
			return 0, err
		}
		err := run(ctx, "mke2fs", "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-O", "^has_journal", "-m", "0",
			"-N", strconv.FormatInt(inodes, 10), "-E", "root_owner=0:0", "-L", "agentconnect",
			"-d", dir, out, strconv.FormatInt(size/1024, 10)+"k")
		if err == nil {
			break
		}
		// Estimated too small (directories or extent trees larger than
		// counted): once more with half as much again.
		if attempt == 1 && ctx.Err() == nil && (strings.Contains(err.Error(), "Could not allocate") || strings.Contains(err.Error(), "No space left")) {
			logf("image: %d MiB was too small for the root, trying %d MiB", size/mib, size*3/2/mib)
			size, inodes = (size*3/2+mib-1)/mib*mib, inodes*3/2
			continue
		}
		return 0, err
	}
	if len(x.fixes) > 0 {
		if err := x.applyFixes(ctx, out); err != nil {
			return 0, err
		}
	}
	return size, nil
}

func run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, prog, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("%s is not installed (Debian package e2fsprogs): %w", prog, err)
		}
		return fmt.Errorf("%s: %w: %s", prog, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// extractor writes a flattened image tar into a directory for mke2fs -d. As
// root it keeps owners, modes, device nodes and extended attributes in the
// directory itself; otherwise it records them as fixes for debugfs.
type extractor struct {
	root     *os.Root // all file system access goes through it: nothing escapes dir
	dir      string
	rootless bool
	logf     func(string, ...any)

	dirs  []dirMeta // applied at the end, once the directories are filled
	fixes []fix     // rootless: applied to the ext4 image with debugfs

	bytes, inodes int64
	skipped       int
}

type dirMeta struct {
	name     string
	mode     int64
	uid, gid int
	mtime    time.Time
}

// fix sets an inode's mode (with its type bits), owner and, for a device
// node it creates first, its numbers.
type fix struct {
	name         string // relative, "." for the root
	mode         uint32 // full st_mode
	uid, gid     int
	mknod        bool
	major, minor uint32
	mtime        int64             // if not 0: the extraction could not set it
	xattrs       map[string]string // extended attributes
}

func newExtractor(dir string, rootless bool, logf func(string, ...any)) (*extractor, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &extractor{root: r, dir: dir, rootless: rootless, logf: logf}, nil
}

const blockSize = 4096

func blocks(n int64) int64 { return (n + blockSize - 1) / blockSize * blockSize }

func (x *extractor) extract(ctx context.Context, tr *tar.Reader) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the image's layers: %w", err)
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		if name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("layer entry %q leaves the root", h.Name)
		}
		if err := x.entry(ctx, h, name, tr); err != nil {
			return fmt.Errorf("layer entry %q: %w", h.Name, err)
		}
	}
}

func (x *extractor) entry(ctx context.Context, h *tar.Header, name string, r io.Reader) error {
	mode := uint32(h.Mode) & 0o7777
	if name != "." {
		if err := x.root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if name != "." {
			if err := x.root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			if fi, err := x.root.Lstat(name); err != nil {
				return err
			} else if !fi.IsDir() {
				return x.skip(name, "a directory where an upper layer has a file")
			}
		}
		x.dirs = append(x.dirs, dirMeta{name, h.Mode, h.Uid, h.Gid, h.ModTime})
		return nil

	case tar.TypeReg: // (the tar reader turns the old TypeRegA into TypeReg)
		f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return x.skip(name, "a second file under the same name")
		}
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, ctxReader{ctx, r}); err != nil {
			f.Close()
			return err
		}
		fd := int(f.Fd())
		xattrs := map[string]string{}
		for k, v := range h.PAXRecords {
			if attr, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				xattrs[attr] = v
			}
		}
		if x.rootless {
			x.fixes = append(x.fixes, fix{name: name, mode: unix.S_IFREG | mode, uid: h.Uid, gid: h.Gid, xattrs: xattrs})
			err = unix.Fchmod(fd, mode|0o600) // mke2fs must read it: debugfs sets the real mode
		} else if err = unix.Fchown(fd, h.Uid, h.Gid); err == nil {
			// After chown, which clears set-id bits and file capabilities.
			if err = unix.Fchmod(fd, mode); err == nil {
				for attr, v := range xattrs {
					if err := unix.Fsetxattr(fd, attr, []byte(v), 0); err != nil {
						x.logf("image: %s: extended attribute %s not kept: %v", name, attr, err)
					}
				}
			}
		}
		if err == nil {
			err = unix.Futimes(fd, timevals(h.ModTime))
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err

	case tar.TypeSymlink:
		if err := x.root.Symlink(h.Linkname, name); errors.Is(err, fs.ErrExist) {
			return x.skip(name, "a second entry under the same name")
		} else if err != nil {
			return err
		}
		if x.rootless {
			x.fixes = append(x.fixes, fix{name: name, mode: unix.S_IFLNK | 0o777, uid: h.Uid, gid: h.Gid, mtime: h.ModTime.Unix()})
			return nil
		}
		return x.at(name, func(dirfd int, base string) error {
			if err := unix.Fchownat(dirfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			ts := timespecs(h.ModTime)
			return unix.UtimesNanoAt(dirfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW)
		})

	case tar.TypeLink:
		target := path.Clean(strings.TrimPrefix(h.Linkname, "/"))
		if err := x.root.Link(target, name); err != nil {
			if errors.Is(err, fs.ErrExist) || errors.Is(err, fs.ErrNotExist) {
				return x.skip(name, fmt.Sprintf("a hard link to %q: %v", h.Linkname, err))
			}
			return err
		}
		return nil

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		typ := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[h.Typeflag]
		if x.rootless {
			if typ == unix.S_IFIFO {
				if err := x.at(name, func(dirfd int, base string) error { return unix.Mknodat(dirfd, base, typ|0o600, 0) }); err != nil {
					return err
				}
				x.fixes = append(x.fixes, fix{name: name, mode: typ | mode, uid: h.Uid, gid: h.Gid})
				return nil
			}
			// Only root may make device nodes: debugfs makes it in the image.
			x.fixes = append(x.fixes, fix{name: name, mode: typ | mode, uid: h.Uid, gid: h.Gid,
				mknod: true, major: uint32(h.Devmajor), minor: uint32(h.Devminor), mtime: h.ModTime.Unix()})
			return nil
		}
		return x.at(name, func(dirfd int, base string) error {
			dev := unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor))
			if err := unix.Mknodat(dirfd, base, typ|0o600, int(dev)); err != nil {
				if errors.Is(err, unix.EEXIST) {
					return x.skip(name, "a second entry under the same name")
				}
				return err
			}
			if err := unix.Fchownat(dirfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if err := unix.Fchmodat(dirfd, base, mode, 0); err != nil {
				return err
			}
			ts := timespecs(h.ModTime)
			return unix.UtimesNanoAt(dirfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW)
		})
	}
	// Sockets, global headers and the like have no place in a root.
	return nil
}

func (x *extractor) skip(name, why string) error {
	x.skipped++
	if x.skipped <= 10 {
		x.logf("image: %s skipped: %s", name, why)
	}
	return nil
}

// at runs fn on name's parent directory, opened through the root (so that
// no symbolic link leads it out), and name's base name.
func (x *extractor) at(name string, fn func(dirfd int, base string) error) error {
	d, err := x.root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer d.Close()
	return fn(int(d.Fd()), path.Base(name))
}

// finish applies the directories' metadata, deepest first.
func (x *extractor) finish() error {
	sort.SliceStable(x.dirs, func(i, j int) bool {
		return strings.Count(x.dirs[i].name, "/") > strings.Count(x.dirs[j].name, "/")
	})
	for _, d := range x.dirs {
		mode := uint32(d.mode) & 0o7777
		if x.rootless {
			x.fixes = append(x.fixes, fix{name: d.name, mode: unix.S_IFDIR | mode, uid: d.uid, gid: d.gid})
			if err := x.root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
				return err
			}
			continue
		}
		if d.name == "." {
			// mke2fs gives the root directory its own owner and mode.
			if mode != 0o755 || d.uid != 0 || d.gid != 0 {
				x.fixes = append(x.fixes, fix{name: ".", mode: unix.S_IFDIR | mode, uid: d.uid, gid: d.gid})
			}
			continue
		}
		err := x.at(d.name, func(dirfd int, base string) error {
			if err := unix.Fchownat(dirfd, base, d.uid, d.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			if err := unix.Fchmodat(dirfd, base, mode, 0); err != nil {
				return err
			}
			ts := timespecs(d.mtime)
			return unix.UtimesNanoAt(dirfd, base, ts[:], unix.AT_SYMLINK_NOFOLLOW)
		})
		if err != nil {
			return fmt.Errorf("directory %s: %w", d.name, err)
		}
	}
	if x.skipped > 10 {
		x.logf("image: %d entries skipped in all", x.skipped)
	}
	return x.measure()
}

// measure counts the tree's inodes and the bytes its blocks take; not being
// root, it also gives the directories the extraction made for entries whose
// parent the image does not list an owner of root.
func (x *extractor) measure() error {
	explicit := map[string]bool{}
	for _, d := range x.dirs {
		explicit[d.name] = true
	}
	seen := map[uint64]bool{}
	for _, f := range x.fixes {
		if f.mknod {
			x.inodes++
		}
	}
	return filepath.WalkDir(x.dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat", p)
		}
		if seen[st.Ino] {
			return nil // another name of a file counted already
		}
		seen[st.Ino] = true
		x.inodes++
		switch {
		case fi.IsDir():
			x.bytes += max(blocks(fi.Size()), blockSize)
		case fi.Mode().IsRegular():
			x.bytes += blocks(fi.Size())
		case fi.Mode()&fs.ModeSymlink != 0 && fi.Size() >= 60: // longer targets do not fit in the inode
			x.bytes += blocks(fi.Size())
		}
		if x.rootless && fi.IsDir() {
			rel, err := filepath.Rel(x.dir, p)
			if err != nil {
				return err
			}
			if name := filepath.ToSlash(rel); !explicit[name] {
				x.fixes = append(x.fixes, fix{name: name, mode: unix.S_IFDIR | 0o755})
			}
		}
		return nil
	})
}

// applyFixes gives the image's inodes the owners, modes and device nodes
// the extraction could not (not being root), in one debugfs run.
func (x *extractor) applyFixes(ctx context.Context, img string) error {
	var script bytes.Buffer
	valDir := ""
	for _, f := range x.fixes {
		p := "/" + f.name
		if f.name == "." {
			p = "/"
		}
		if strings.ContainsAny(p, "\"\n\\") {
			return fmt.Errorf("%q: a name with a quote, backslash or newline needs the daemon to run as root", p)
		}
		q := `"` + p + `"`
		if f.mknod {
			kind := "c"
			if f.mode&unix.S_IFMT == unix.S_IFBLK {
				kind = "b"
			}
			// debugfs's mknod takes a name in the current directory.
			fmt.Fprintf(&script, "cd \"%s\"\nmknod \"%s\" %s %d %d\ncd /\n", path.Dir(p), path.Base(p), kind, f.major, f.minor)
		}
		fmt.Fprintf(&script, "sif %s mode 0%o\nsif %s uid %d\nsif %s gid %d\n", q, f.mode, q, f.uid, q, f.gid)
		if f.mtime > 0 {
			fmt.Fprintf(&script, "sif %s mtime @%d\n", q, f.mtime)
		}
		for attr, v := range f.xattrs {
			if strings.ContainsAny(attr, "\" \n\\") {
				return fmt.Errorf("%q: extended attribute %q needs the daemon to run as root", p, attr)
			}
			if valDir == "" {
				var err error
				if valDir, err = os.MkdirTemp(filepath.Dir(img), "xattrs-"); err != nil {
					return err
				}
				defer os.RemoveAll(valDir)
			}
			vf := filepath.Join(valDir, strconv.Itoa(script.Len()))
			if err := os.WriteFile(vf, []byte(v), 0o600); err != nil {
				return err
			}
			fmt.Fprintf(&script, "ea_set -f \"%s\" %s %s\n", vf, q, attr)
		}
	}
	cmd := exec.CommandContext(ctx, "debugfs", "-w", "-f", "-", img)
	cmd.Stdin = &script
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("debugfs: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	// debugfs exits 0 whatever its commands do: any message but its banner
	// is a failure.
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "debugfs ") {
			continue
		}
		return fmt.Errorf("debugfs, setting owners and modes: %s", line)
	}
	return nil
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func timevals(t time.Time) []unix.Timeval {
	tv := unix.NsecToTimeval(t.UnixNano())
	return []unix.Timeval{tv, tv}
}

func timespecs(t time.Time) [2]unix.Timespec {
	ts := unix.NsecToTimespec(t.UnixNano())
	return [2]unix.Timespec{ts, ts}
}

// spooledImage is an image whose layers are each downloaded to an unlinked
// temporary file and checked against their digest before they are
// extracted, so that a layer corrupted in the registry or in transfer is
// reported as such rather than as whatever its bytes break in the tar reader.
type spooledImage struct {
	v1.Image
	dir string
}

func (s spooledImage) Layers() ([]v1.Layer, error) {
	ls, err := s.Image.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Layer, len(ls))
	for i, l := range ls {
		out[i] = spooledLayer{l, s.dir}
	}
	return out, nil
}

type spooledLayer struct {
	v1.Layer
	dir string
}

func (l spooledLayer) Uncompressed() (io.ReadCloser, error) {
	d, err := l.Digest()
	if err != nil {
		return nil, err
	}
	mt, err := l.MediaType()
	if err != nil {
		return nil, err
	}
	rc, err := l.Compressed() // verified against d at its end
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", d, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(l.dir, "layer-")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	n, err := io.Copy(f, rc)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("layer %s could not be downloaded intact (it does not match its digest, or the transfer failed): %w", d, err)
	}
	fl, err := partial.CompressedToLayer(&fileLayer{f: f, digest: d, size: n, mediaType: mt})
	if err != nil {
		f.Close()
		return nil, err
	}
	u, err := fl.Uncompressed()
	if err != nil {
		f.Close()
		return nil, err
	}
	return u, nil
}

// fileLayer is a verified layer blob in an open file (partial.CompressedLayer).
type fileLayer struct {
	f         *os.File
	digest    v1.Hash
	size      int64
	mediaType types.MediaType
}

func (l *fileLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error) { return l.mediaType, nil }
func (l *fileLayer) Compressed() (io.ReadCloser, error) {
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(l.f, 0, l.size), l.f}, nil
}
