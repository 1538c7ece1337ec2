package vmtransport

import (
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"time"
)

// The kinds of connection a preface names. A ttrpc connection carries the
// vmagent API; the others carry the raw bytes of one stdio stream of the
// process whose id follows the kind.
const (
	KindTTRPC  = "ttrpc"
	KindStdin  = "stdin"
	KindStdout = "stdout"
	KindStderr = "stderr"
)

// MaxPrefaceLen bounds a preface line, newline included. The longest real
// one is "stderr " plus a 63-byte id and the newline: 71 bytes.
const MaxPrefaceLen = 256

// PrefaceTimeout bounds how long ReadPreface waits for the line: the shim
// writes it as soon as the connection is open, so a silent peer is broken.
const PrefaceTimeout = 10 * time.Second

// ErrBadPreface is the kind of error ReadPreface returns for a line that is
// not a preface (too long, unknown kind, bad id, cut short).
var ErrBadPreface = errors.New("bad preface")

// idPattern is the process id charset: the same as the daemon's names, so
// an id is safe in a preface line, a log line and a file name.
// Compiled when first used, not at every start of the binary.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`) })

// CheckID returns an error unless id is a valid process id: 1 to 63
// letters, digits, '_', '.' or '-', starting with a letter or digit.
func CheckID(id string) error {
	if !idPattern().MatchString(id) {
		return fmt.Errorf("invalid process id %q: want 1 to 63 letters, digits, '_', '.' or '-', starting with a letter or digit", id)
	}
	return nil
}

// WritePreface writes the preface of a new connection: kind is KindTTRPC
// (with an empty id) or a stdio kind with the process id.
func WritePreface(w io.Writer, kind, id string) error {
	line, err := prefaceLine(kind, id)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, line); err != nil {
		return fmt.Errorf("write preface %q: %w", strings.TrimSpace(line), err)
	}
	return nil
}

func prefaceLine(kind, id string) (string, error) {
	switch kind {
	case KindTTRPC:
		if id != "" {
			return "", fmt.Errorf("preface: a %s connection takes no id (got %q)", kind, id)
		}
		return kind + "\n", nil
	case KindStdin, KindStdout, KindStderr:
		if err := CheckID(id); err != nil {
			return "", fmt.Errorf("preface: %w", err)
		}
		return kind + " " + id + "\n", nil
	default:
		return "", fmt.Errorf("preface: unknown kind %q", kind)
	}
}

// ReadPreface reads the preface of a new connection, waiting at most
// PrefaceTimeout, and returns its kind and id (empty for KindTTRPC). It reads
// nothing past the newline, so the connection's payload is left intact.
func ReadPreface(conn net.Conn) (kind, id string, err error) {
	return readPreface(conn, PrefaceTimeout)
}

func readPreface(conn net.Conn, timeout time.Duration) (kind, id string, err error) {
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return "", "", fmt.Errorf("read preface: %w", err)
	}
	line, err := readLine(conn, MaxPrefaceLen)
	if err != nil {
		return "", "", fmt.Errorf("read preface: %w", err)
	}
	// A connection the peer closed after its preface refuses deadlines;
	// its reader will see the end of file.
	conn.SetReadDeadline(time.Time{})
	return parsePreface(line)
}

// readLine reads one byte at a time up to and including '\n', so that it
// never consumes what follows; it returns the line without its newline.
func readLine(r io.Reader, max int) (string, error) {
	buf := make([]byte, 0, 32)
	var b [1]byte
	for len(buf) < max {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return string(buf), nil
			}
			buf = append(buf, b[0])
			continue
		}
		if err == io.EOF {
			return "", fmt.Errorf("%w: connection closed after %d bytes, before the newline (%w)", ErrBadPreface, len(buf), io.ErrUnexpectedEOF)
		}
		if err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("%w: no newline in the first %d bytes", ErrBadPreface, max)
}

func parsePreface(line string) (kind, id string, err error) {
	fields := strings.Split(line, " ")
	switch {
	case len(fields) == 1 && fields[0] == KindTTRPC:
		return KindTTRPC, "", nil
	case len(fields) == 2 && (fields[0] == KindStdin || fields[0] == KindStdout || fields[0] == KindStderr):
		if err := CheckID(fields[1]); err != nil {
			return "", "", fmt.Errorf("%w: %v", ErrBadPreface, err)
		}
		return fields[0], fields[1], nil
	default:
		return "", "", fmt.Errorf("%w: %q is not \"ttrpc\" or \"stdin|stdout|stderr ID\"", ErrBadPreface, line)
	}
}
