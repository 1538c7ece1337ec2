package inject

import (
	"bytes"
	"io"
)

// redactor reads src with every value replaced by its placeholder. It holds
// back only a tail that could be the start of a value, so that a stream
// (server-sent events) is not delayed: values hold no newline, so a line's
// end is never held.
type redactor struct {
	src   io.Reader
	pairs [][2][]byte // what is swapped, for what
	buf   []byte      // read, not yet passed on
	out   []byte      // ready to pass on
	err   error       // src's, once it has one
}

func newRedactor(src io.Reader, pairs [][2][]byte) *redactor {
	return &redactor{src: src, pairs: pairs}
}

func (r *redactor) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil && len(r.buf) == 0 {
			return 0, r.err
		}
		if r.err == nil {
			var tmp [32 << 10]byte
			n, err := r.src.Read(tmp[:])
			r.buf = append(r.buf, tmp[:n]...)
			r.err = err
		}
		r.scan()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// scan moves what is decided from buf to out: the text before a value, the
// value's placeholder, and what cannot begin a value.
func (r *redactor) scan() {
	for {
		at, k := -1, -1
		for i, pr := range r.pairs {
			if j := bytes.Index(r.buf, pr[0]); j >= 0 && (at < 0 || j < at) {
				at, k = j, i
			}
		}
		if at < 0 {
			break
		}
		r.out = append(r.out, r.buf[:at]...)
		r.out = append(r.out, r.pairs[k][1]...)
		r.buf = r.buf[at+len(r.pairs[k][0]):]
	}
	hold := 0
	if r.err == nil {
		hold = r.partial()
	}
	r.out = append(r.out, r.buf[:len(r.buf)-hold]...)
	r.buf = append([]byte(nil), r.buf[len(r.buf)-hold:]...)
}

// partial is the length of the longest tail of buf that begins a value.
func (r *redactor) partial() int {
	longest := 0
	for _, pr := range r.pairs {
		for n := min(len(pr[0])-1, len(r.buf)); n > longest; n-- {
			if bytes.HasPrefix(pr[0], r.buf[len(r.buf)-n:]) {
				longest = n
				break
			}
		}
	}
	return longest
}
