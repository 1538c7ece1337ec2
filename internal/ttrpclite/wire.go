// Package ttrpclite speaks the unary calls of ttrpc's wire protocol
// (github.com/containerd/ttrpc, PROTOCOL.md) without the protobuf and gRPC
// runtimes the ttrpc library links. The shim API uses it: an idle shim is
// mostly the code it maps, and those runtimes were a third of it (the
// numbers are in docs/design-notes.md). Frames, the Request and Response
// envelopes and the status codes are ttrpc's, so either side talks to the
// library's other side: a supervisor of this release adopts the shims of
// the previous one. Streams are not supported; the shim API has none.
package ttrpclite

import (
	"encoding/binary"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/agentconnect-md/agentconnect/internal/errdefs"
)

const (
	headerLength = 10
	// MaxMessage is ttrpc's bound on a frame's data, both ways.
	MaxMessage = 4 << 20

	typeRequest  = 0x1
	typeResponse = 0x2
	typeData     = 0x3
)

// header is a frame's: its data's length, the stream (one call) it belongs
// to, its type and flags. Big-endian, as ttrpc's.
type header struct {
	length   uint32
	streamID uint32
	typ      byte
	flags    byte
}

func readHeader(r io.Reader, buf *[headerLength]byte) (header, error) {
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return header{}, err
	}
	return header{
		length:   binary.BigEndian.Uint32(buf[0:4]),
		streamID: binary.BigEndian.Uint32(buf[4:8]),
		typ:      buf[8],
		flags:    buf[9],
	}, nil
}

// appendFrame appends a frame of data to b.
func appendFrame(b []byte, streamID uint32, typ byte, data []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	b = binary.BigEndian.AppendUint32(b, streamID)
	b = append(b, typ, 0)
	return append(b, data...)
}

// request is ttrpc.Request: service = 1, method = 2, payload = 3,
// timeout_nano = 4 (metadata = 5 is neither sent nor read).
type request struct {
	service, method string
	payload         []byte
	timeoutNano     int64
}

func (r *request) marshal() []byte {
	var b []byte
	b = appendString(b, 1, r.service)
	b = appendString(b, 2, r.method)
	b = appendBytes(b, 3, r.payload)
	if r.timeoutNano != 0 {
		b = protowire.AppendTag(b, 4, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.timeoutNano))
	}
	return b
}

func (r *request) unmarshal(b []byte) error {
	return EachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			r.service = string(v)
			return n, nil
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			r.method = string(v)
			return n, nil
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			r.payload = v
			return n, nil
		case num == 4 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			r.timeoutNano = int64(v)
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

// response is ttrpc.Response: status = 1 (google.rpc.Status: code = 1,
// message = 2; details = 3 are neither sent nor read), payload = 2.
type response struct {
	code    errdefs.Code
	message string
	payload []byte
}

func (r *response) marshal() []byte {
	var st []byte
	if r.code != errdefs.CodeOK {
		st = protowire.AppendTag(st, 1, protowire.VarintType)
		st = protowire.AppendVarint(st, uint64(r.code))
	}
	st = appendString(st, 2, r.message)
	// The library always sends the status, empty when it is OK.
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, st)
	return appendBytes(b, 2, r.payload)
}

func (r *response) unmarshal(b []byte) error {
	return EachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			st, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			return n, EachField(st, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
				switch {
				case num == 1 && typ == protowire.VarintType:
					v, n := protowire.ConsumeVarint(b)
					r.code = errdefs.Code(int32(v))
					return n, nil
				case num == 2 && typ == protowire.BytesType:
					v, n := protowire.ConsumeBytes(b)
					r.message = string(v)
					return n, nil
				}
				return protowire.ConsumeFieldValue(num, typ, b), nil
			})
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			r.payload = v
			return n, nil
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// EachField walks the fields of a protobuf message: it calls field with each
// field's number, wire type and the bytes from its value on, and field
// returns how many bytes the value took (negative: a protowire error). A
// field it does not know field skips with protowire.ConsumeFieldValue, as
// protobuf skips unknown fields. The message codecs of the APIs spoken over
// this package use it too.
func EachField(b []byte, field func(protowire.Number, protowire.Type, []byte) (int, error)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("bad protobuf field tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		m, err := field(num, typ, b)
		if err != nil {
			return err
		}
		if m < 0 {
			return fmt.Errorf("bad protobuf field %d: %w", num, protowire.ParseError(m))
		}
		b = b[m:]
	}
	return nil
}
