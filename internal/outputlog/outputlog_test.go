package outputlog

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func readAll(t *testing.T, path string, off int64) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []Record
	r := NewReader(f, off)
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return recs
		}
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
}

func TestWriteReadResume(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	w, err := OpenWriter(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(Stdout, []byte("hello\n"))
	w.Write(Stderr, []byte("oops\n"))
	big := bytes.Repeat([]byte("x"), MaxPayload+10)
	w.Write(Stdout, big)
	w.Close()

	recs := readAll(t, path, 0)
	if len(recs) != 4 {
		t.Fatalf("got %d records, want 4 (the big write split in two)", len(recs))
	}
	if recs[0].Stream != Stdout || string(recs[0].Data) != "hello\n" {
		t.Errorf("record 0 = %v %q", recs[0].Stream, recs[0].Data)
	}
	if recs[1].Stream != Stderr || string(recs[1].Data) != "oops\n" {
		t.Errorf("record 1 = %v %q", recs[1].Stream, recs[1].Data)
	}
	if got := len(recs[2].Data) + len(recs[3].Data); got != len(big) {
		t.Errorf("big write came back as %d bytes, want %d", got, len(big))
	}

	// Reading from a later boundary gives the rest.
	rest := readAll(t, path, recs[1].Offset)
	if len(rest) != 3 || rest[0].Offset != recs[1].Offset {
		t.Errorf("from offset %d got %d records", recs[1].Offset, len(rest))
	}

	// A second writer (a resumed session) continues after the old output.
	w, err = OpenWriter(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(Stdout, []byte("again\n"))
	w.Close()
	recs = readAll(t, path, 0)
	if len(recs) != 5 || string(recs[4].Data) != "again\n" {
		t.Fatalf("after resume got %d records, last %q", len(recs), recs[len(recs)-1].Data)
	}
}

func TestTornTailIsCut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	w, _ := OpenWriter(path, 0)
	w.Write(Stdout, []byte("complete\n"))
	end := w.Size()
	w.Write(Stdout, []byte("this one will be torn\n"))
	w.Close()
	// Cut the last record in the middle of its payload.
	os.Truncate(path, end+headerSize+3)

	recs := readAll(t, path, 0)
	if len(recs) != 1 {
		t.Fatalf("reader returned %d records before the torn one, want 1", len(recs))
	}
	w, err := OpenWriter(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	if w.Size() != end {
		t.Errorf("writer resumes at %d, want %d", w.Size(), end)
	}
	w.Write(Stderr, []byte("next\n"))
	w.Close()
	recs = readAll(t, path, 0)
	if len(recs) != 2 || string(recs[1].Data) != "next\n" {
		t.Errorf("after the torn tail got %d records", len(recs))
	}
}

func TestPartialRecordIsReadLater(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	w, _ := OpenWriter(path, 0)
	w.Write(Stdout, []byte("abcdef"))
	w.Close()
	full, _ := os.ReadFile(path)
	// A reader sees only part of the record at first...
	f, _ := os.Create(path)
	f.Write(full[:headerSize+2])
	r := NewReader(f, 0)
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("Next on a partial record = %v, want io.EOF", err)
	}
	// ...and the whole of it once the write completes.
	f.Write(full[headerSize+2:])
	rec, err := r.Next()
	if err != nil || string(rec.Data) != "abcdef" {
		t.Fatalf("Next after completion = %q, %v", rec.Data, err)
	}
	f.Close()
}

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	w, _ := OpenWriter(path, 0)
	w.Write(Stdout, []byte("one\n"))
	second := w.Size()
	w.Write(Stdout, []byte("two\n"))
	size := w.Size()
	w.Close()
	f, _ := os.Open(path)
	defer f.Close()
	for _, off := range []int64{0, second, size} {
		if err := Check(f, off, size); err != nil {
			t.Errorf("Check(%d) = %v, want nil", off, err)
		}
	}
	for _, off := range []int64{1, second - 1, second + 3, size + 1, -1} {
		if err := Check(f, off, size); !errors.Is(err, ErrNotBoundary) {
			t.Errorf("Check(%d) = %v, want ErrNotBoundary", off, err)
		}
	}
}

func TestCorruptIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	os.WriteFile(path, bytes.Repeat([]byte("garbage!"), 4), 0o600)
	f, _ := os.Open(path)
	defer f.Close()
	if _, err := NewReader(f, 0).Next(); err == nil || err == io.EOF {
		t.Errorf("Next on garbage = %v, want a corruption error", err)
	}
}

// TestLimit: records stop at the limit, the last one cut to fit; one notice
// may follow; a writer opened again on the full log adds nothing.
func TestLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "output.log")
	const limit = 100 << 10
	w, err := OpenWriter(path, limit)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("y"), 40<<10)
	var werr error
	writes := 0
	for ; writes < 10 && werr == nil; writes++ {
		werr = w.Write(Stdout, chunk)
	}
	if !errors.Is(werr, ErrFull) || writes != 3 {
		t.Fatalf("after %d writes of 40 KiB under a 100 KiB limit: %v, want ErrFull on the 3rd", writes, werr)
	}
	if w.Size() != limit || !w.Full() {
		t.Errorf("size %d (full %v), want exactly the limit %d", w.Size(), w.Full(), limit)
	}
	if err := w.Write(Stderr, []byte("more")); !errors.Is(err, ErrFull) {
		t.Errorf("a write to a full log = %v, want ErrFull", err)
	}
	if err := w.WriteNotice(Stderr, bytes.Repeat([]byte("n"), MaxNotice+1)); err == nil {
		t.Error("a notice over MaxNotice was written")
	}
	w.WriteNotice(Stderr, []byte("limit reached\n"))
	w.WriteNotice(Stderr, []byte("a second notice\n"))
	w.Close()
	recs := readAll(t, path, 0)
	last := recs[len(recs)-1]
	if last.Stream != Stderr || string(last.Data) != "limit reached\n" {
		t.Errorf("last record %v %q, want the one notice", last.Stream, last.Data)
	}
	fi, _ := os.Stat(path)
	if fi.Size() > limit+headerSize+MaxNotice {
		t.Errorf("log is %d bytes, over the limit plus one notice", fi.Size())
	}
	w, err = OpenWriter(path, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if !w.Full() || !errors.Is(w.Write(Stdout, []byte("x")), ErrFull) {
		t.Error("a writer opened on a full log is not full")
	}
}

// TestFullDiskLeavesNoPartialRecord fills a small tmpfs: the write the disk
// cuts short is taken back whole, the log reads to its last good record, and
// the next record that fits starts where the refused one would have.
func TestFullDiskLeavesNoPartialRecord(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs (CI runs as root)")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount a 64 KiB tmpfs: %v", err)
	}
	defer syscall.Unmount(dir, 0)
	path := filepath.Join(dir, "output.log")
	w, err := OpenWriter(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	rec := bytes.Repeat([]byte("y"), 3000) // records do not fit the disk evenly
	written := 0
	for ; written < 100; written++ {
		if err = w.Write(Stdout, rec); err != nil {
			break
		}
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("after %d records: %v, want ENOSPC", written, err)
	}
	if got := len(readAll(t, path, 0)); got != written {
		t.Fatalf("the full log reads %d records, want the %d written", got, written)
	}
	fi, _ := os.Stat(path)
	if fi.Size() != w.Size() {
		t.Fatalf("the file is %d bytes, the writer says %d: a partial record stayed", fi.Size(), w.Size())
	}
	// What the disk still has room for goes in right after the others.
	if err := w.Write(Stdout, rec[:10]); err != nil {
		t.Fatalf("a record that fits after the disk filled: %v", err)
	}
	recs := readAll(t, path, 0)
	if len(recs) != written+1 || !bytes.Equal(recs[written].Data, rec[:10]) {
		t.Fatalf("%d records, the last %q: want %d, the last the new one", len(recs), recs[len(recs)-1].Data[:10], written+1)
	}
}
