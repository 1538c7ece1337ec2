// Package outputlog is a session's append-only output log: stdout and stderr
// records, each found again by the byte offset where it starts.
//
// A record is a 16-byte header and a payload:
//
//	[0:2]  magic "AC"
//	[2]    stream: 1 stdout, 2 stderr, 3 stdin (what was written to the
//	       runtime, when the writer asked for it to be recorded)
//	[3]    reserved, 0
//	[4:8]  payload length, little endian
//	[8:16] the record's own offset in the log, little endian
//
// Because a header names its own offset, an offset from a client is checked
// in constant time: it is a record boundary when a header that names it is
// there. The shim is the only writer; any number of readers follow the file.
//
// A log may have a limit: its records stop there (the last one cut to fit),
// and one notice record may follow, so the file never grows past the limit
// plus MaxNotice and a header.
package outputlog

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// Stream tells stdout from stderr, and both from recorded stdin.
type Stream byte

const (
	Stdout Stream = 1
	Stderr Stream = 2
	Stdin  Stream = 3
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	case Stdin:
		return "stdin"
	}
	return fmt.Sprintf("stream(%d)", byte(s))
}

const (
	headerSize = 16
	// MaxPayload bounds one record, so one record always fits one message of
	// the admin API (ttrpc caps messages at 4 MiB).
	MaxPayload = 64 << 10
	// MaxNotice bounds the one record WriteNotice may add past the limit.
	MaxNotice = 1 << 10
)

var magic = [2]byte{'A', 'C'}

// Record is one write of the runtime's output.
type Record struct {
	Offset int64 // where the record starts
	Stream Stream
	Data   []byte
}

// Next is the offset of the record after r.
func (r Record) Next() int64 { return r.Offset + headerSize + int64(len(r.Data)) }

// ErrNotBoundary is returned for an offset that is not where a record starts.
var ErrNotBoundary = errors.New("not a record boundary")

// ErrFull is returned by Write once the log has reached its limit: the
// output that did not fit was dropped.
var ErrFull = errors.New("output log is full")

// Writer appends records. It is safe for concurrent use.
type Writer struct {
	mu     sync.Mutex // guards the fields below
	f      *os.File
	size   int64
	limit  int64 // 0: none
	buf    []byte
	notice bool // WriteNotice has written its record
}

// OpenWriter opens the log at path for appending, creating it if needed. A
// torn record at the end (a crash mid-write) is cut off, so the next record
// starts on a boundary. A limit above 0 bounds the records Write adds to
// the file's size.
func OpenWriter(path string, limit int64) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open output log: %w", err)
	}
	end, err := validEnd(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Truncate(end); err != nil {
		f.Close()
		return nil, fmt.Errorf("open output log: %w", err)
	}
	if _, err := f.Seek(end, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("open output log: %w", err)
	}
	return &Writer{f: f, size: end, limit: limit, buf: make([]byte, 0, headerSize+MaxPayload)}, nil
}

// validEnd returns the end of the last complete record.
func validEnd(f *os.File) (int64, error) {
	r := NewReader(f, 0)
	for {
		_, err := r.Next()
		if err == io.EOF {
			return r.Offset(), nil
		}
		if err != nil {
			// A broken header after good records is a torn tail too.
			return r.Offset(), nil
		}
	}
}

// Write appends p as records of stream s. Each record is one write(2). With
// a limit, what would take the log past it is cut off, and ErrFull says so.
func (w *Writer) Write(s Stream, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(p) > 0 {
		n := min(len(p), MaxPayload)
		if w.limit > 0 {
			room := w.limit - w.size - headerSize
			if room <= 0 {
				return ErrFull
			}
			n = int(min(int64(n), room))
		}
		if err := w.writeLocked(s, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// WriteNotice appends one record of at most MaxNotice bytes past the limit,
// to say why the output ends there. Only the first call writes.
func (w *Writer) WriteNotice(s Stream, p []byte) error {
	if len(p) > MaxNotice {
		return fmt.Errorf("write output log: a notice of %d bytes is over %d", len(p), MaxNotice)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.notice {
		return nil
	}
	w.notice = true
	return w.writeLocked(s, p)
}

func (w *Writer) writeLocked(s Stream, p []byte) error {
	b := w.buf[:headerSize]
	b[0], b[1], b[2], b[3] = magic[0], magic[1], byte(s), 0
	binary.LittleEndian.PutUint32(b[4:8], uint32(len(p)))
	binary.LittleEndian.PutUint64(b[8:16], uint64(w.size))
	b = append(b, p...)
	if _, err := w.f.Write(b); err != nil {
		// A write cut short (a full disk) leaves part of a record: take it
		// back, so the log stays whole and the same record can be written
		// again.
		if terr := w.f.Truncate(w.size); terr != nil {
			return fmt.Errorf("write output log: %w (and cutting the partial record: %v)", err, terr)
		}
		if _, serr := w.f.Seek(w.size, io.SeekStart); serr != nil {
			return fmt.Errorf("write output log: %w (and seeking back: %v)", err, serr)
		}
		return fmt.Errorf("write output log: %w", err)
	}
	w.size += int64(len(b))
	return nil
}

// Full reports whether the log has reached its limit: Write adds nothing.
func (w *Writer) Full() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.limit > 0 && w.size+headerSize >= w.limit
}

// Size is the offset the next record will start at.
func (w *Writer) Size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.size
}

// Close closes the log.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}

// Reader reads records from an offset on.
type Reader struct {
	f   io.ReaderAt
	off int64
	br  *bufio.Reader
}

// NewReader reads f from offset off, which must be a record boundary (Check
// tells).
func NewReader(f io.ReaderAt, off int64) *Reader {
	r := &Reader{f: f}
	r.reset(off)
	return r
}

func (r *Reader) reset(off int64) {
	r.off = off
	r.br = bufio.NewReaderSize(io.NewSectionReader(r.f, off, 1<<62), 64<<10)
}

// Offset is where the next record starts.
func (r *Reader) Offset() int64 { return r.off }

// Next returns the next complete record. At the end of the log, or before a
// record still being written, it returns io.EOF and can be called again once
// the log has grown.
func (r *Reader) Next() (Record, error) {
	var h [headerSize]byte
	if _, err := io.ReadFull(r.br, h[:]); err != nil {
		return r.retry(err)
	}
	if h[0] != magic[0] || h[1] != magic[1] || int64(binary.LittleEndian.Uint64(h[8:16])) != r.off {
		return Record{}, fmt.Errorf("output log corrupt at offset %d", r.off)
	}
	n := binary.LittleEndian.Uint32(h[4:8])
	if n > MaxPayload {
		return Record{}, fmt.Errorf("output log corrupt at offset %d: record of %d bytes", r.off, n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(r.br, data); err != nil {
		return r.retry(err)
	}
	rec := Record{Offset: r.off, Stream: Stream(h[2]), Data: data}
	r.off = rec.Next()
	return rec, nil
}

// retry turns a short read into io.EOF and rewinds to the record start, so
// that a record being written is read whole on a later call.
func (r *Reader) retry(err error) (Record, error) {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		r.reset(r.off)
		return Record{}, io.EOF
	}
	return Record{}, fmt.Errorf("read output log: %w", err)
}

// Check reports whether off is a record boundary of f, whose size is size:
// the end, or a place where a header names off.
func Check(f io.ReaderAt, off, size int64) error {
	if off == size {
		return nil
	}
	if off < 0 || off > size {
		return fmt.Errorf("offset %d is outside the log (0 to %d): %w", off, size, ErrNotBoundary)
	}
	var h [headerSize]byte
	if _, err := f.ReadAt(h[:], off); err != nil {
		return fmt.Errorf("offset %d: %w", off, ErrNotBoundary)
	}
	if h[0] != magic[0] || h[1] != magic[1] || int64(binary.LittleEndian.Uint64(h[8:16])) != off {
		return fmt.Errorf("offset %d: %w", off, ErrNotBoundary)
	}
	return nil
}
