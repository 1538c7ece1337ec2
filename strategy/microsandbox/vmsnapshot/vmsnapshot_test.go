package vmsnapshot

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sparseFile is a file of size bytes with data at the given offsets (one
// page each) and holes elsewhere.
func sparseFile(t *testing.T, dir string, size int64, at ...int64) *os.File {
	t.Helper()
	f, err := os.CreateTemp(dir, "ram")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for i, off := range at {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func allocated(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestCopySparseKeepsHoles: the copy has the source's bytes everywhere and
// allocates only where the source has data, into a memfd as the shim does.
func TestCopySparseKeepsHoles(t *testing.T) {
	const size = 64 << 20
	src := sparseFile(t, t.TempDir(), size, 0, 8<<20, size-4096)
	fd, err := unix.MemfdCreate("test-ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	dst := os.NewFile(uintptr(fd), "test-ram")
	defer dst.Close()
	if err := CopySparse(dst, src, size); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src.Name())
	got := make([]byte, size)
	if _, err := dst.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the copy's bytes differ from the source's")
	}
	// The read above allocated nothing in the memfd's holes (reads of a
	// hole do not); three pages of data, with some slack for the fs.
	if a := allocated(t, dst); a > 1<<20 {
		t.Errorf("the copy allocated %d bytes for 3 pages of data", a)
	}
}

func TestSaveOpenRemove(t *testing.T) {
	st := Store{Dir: filepath.Join(t.TempDir(), "vm-snapshots")}
	if s, err := st.Open("k1"); s != nil || err != nil {
		t.Fatalf("Open of no snapshot = %v, %v; want nil, nil", s, err)
	}
	ram := sparseFile(t, t.TempDir(), 16<<20, 4096)
	if err := st.Save("k1", func(f *os.File) error { _, err := f.WriteString("device state"); return err }, ram); err != nil {
		t.Fatal(err)
	}
	s, err := st.Open("k1")
	if err != nil || s == nil {
		t.Fatalf("Open after Save = %v, %v", s, err)
	}
	state, _ := os.ReadFile(s.State.Name())
	if string(state) != "device state" {
		t.Errorf("state = %q", state)
	}
	if fi, _ := s.RAM.Stat(); fi.Size() != 16<<20 {
		t.Errorf("ram is %d bytes, want %d", fi.Size(), 16<<20)
	}
	// A second save under the key keeps the first; a failed one leaves
	// nothing.
	if err := st.Save("k1", func(f *os.File) error { _, err := f.WriteString("other"); return err }, ram); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(st.Dir, "k1", stateFile)); string(b) != "device state" {
		t.Errorf("a second save replaced the first: %q", b)
	}
	if err := st.Save("k2", func(*os.File) error { return errors.New("QEMU said no") }, ram); err == nil {
		t.Error("a save whose state failed succeeded")
	}
	if entries, _ := os.ReadDir(st.Dir); len(entries) != 1 {
		t.Errorf("after a failed save the store holds %d entries, want 1", len(entries))
	}
	// Removed while open: the open files still read.
	if err := st.Remove("k1"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(s.State.Fd()))); err != nil || string(b) != "device state" {
		t.Errorf("the open snapshot after Remove: %q, %v", b, err)
	}
	s.Close()
	if s, err := st.Open("k1"); s != nil || err != nil {
		t.Errorf("Open after Remove = %v, %v; want nil, nil", s, err)
	}
	if entries, _ := os.ReadDir(st.Dir); len(entries) != 0 {
		t.Errorf("after Remove the store holds %d entries, want 0", len(entries))
	}
}

// TestSaveLeavesZerosOut: a saved RAM file has the guest's bytes
// everywhere and allocates only its pages that are not all zeros: a memfd
// (the guest's RAM) with data, written zeros between data pages (a run of
// them, one alone, and one page with a single byte set), an extent longer
// than the copy's buffer, and holes.
func TestSaveLeavesZerosOut(t *testing.T) {
	const size = 32 << 20
	fd, err := unix.MemfdCreate("test-ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	ram := os.NewFile(uintptr(fd), "test-ram")
	defer ram.Close()
	if err := ram.Truncate(size); err != nil {
		t.Fatal(err)
	}
	write := func(off int64, b []byte) {
		t.Helper()
		if _, err := ram.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	write(0, bytes.Repeat([]byte{1}, 4096))
	write(4096, make([]byte, 64<<10)) // zeros, then data, zero, data
	write(4096+64<<10, bytes.Repeat([]byte{2}, 4096))
	write(8192+64<<10, make([]byte, 4096))
	write(12288+64<<10, bytes.Repeat([]byte{3}, 4096))
	write(8<<20, make([]byte, 1<<20)) // an extent of zeros only
	one := make([]byte, 4096)
	one[4095] = 4
	write(16<<20, one)
	// An extent longer than copyBuffer, its data on both sides of a
	// buffer's end.
	write(20<<20, make([]byte, 3<<20))
	write(20<<20+copyBuffer-4096, bytes.Repeat([]byte{6}, 8192))
	write(size-4096, bytes.Repeat([]byte{5}, 4096))
	if a := allocated(t, ram); a < 1<<20 {
		t.Fatalf("the test's RAM allocates %d bytes; want its written zeros allocated", a)
	}
	st := Store{Dir: filepath.Join(t.TempDir(), "vm-snapshots")}
	if err := st.Save("k", func(f *os.File) error { return nil }, ram); err != nil {
		t.Fatal(err)
	}
	s, err := st.Open("k")
	if err != nil || s == nil {
		t.Fatalf("Open after Save = %v, %v", s, err)
	}
	defer s.Close()
	want := make([]byte, size)
	if _, err := ram.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(s.RAM.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the saved RAM's bytes differ from the guest's")
	}
	// Seven pages of data, with some slack for the fs; the zeros alone are
	// 4 MiB.
	if a := allocated(t, s.RAM); a > 512<<10 {
		t.Errorf("the saved RAM allocates %d bytes for 7 pages of data", a)
	}
}

// TestSaveKeepsTheMostRecentlyUsed: beyond Keep, the least recently used
// snapshot goes; an Open counts as a use.
func TestSaveKeepsTheMostRecentlyUsed(t *testing.T) {
	st := Store{Dir: t.TempDir()}
	ram := sparseFile(t, t.TempDir(), 1<<20)
	noState := func(*os.File) error { return nil }
	old := time.Now().Add(-time.Hour)
	for i := range Keep {
		key := "k" + strconv.Itoa(i)
		if err := st.Save(key, noState, ram); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(filepath.Join(st.Dir, key), old.Add(time.Duration(i)*time.Minute), old.Add(time.Duration(i)*time.Minute))
	}
	s, _ := st.Open("k0") // the oldest, used now
	s.Close()
	if err := st.Save("new", noState, ram); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"k0": true, "k1": false, "k2": true, "new": true} {
		_, err := os.Stat(filepath.Join(st.Dir, key))
		if got := err == nil; got != want {
			t.Errorf("%s kept = %v, want %v", key, got, want)
		}
	}
}
