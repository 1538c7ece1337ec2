package shimv1

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/agentconnect-md/agentconnect/internal/ttrpclite"
)

// The messages of shim.proto, encoded by hand: protoc-gen-go's code links
// the protobuf runtime, which was a third of an idle shim's memory. Each
// message lists its fields once (fields); marshal and unmarshal walk the
// list. The encoding is protobuf's, field for field, which the tests check
// against the generated code in internal/shimpb.

// message is what travels: a request or response of the Shim service.
type message interface {
	fields() []field
}

// field is one field of a message: its number, its wire type, how to append
// its value (nothing for proto3's zero value) and how to read it.
type field struct {
	num     protowire.Number
	typ     protowire.Type
	append  func(b []byte) []byte
	consume func(b []byte) (int, error)
}

func marshal(m message) []byte {
	var b []byte
	for _, f := range m.fields() {
		b = f.append(b)
	}
	return b
}

// unmarshal reads b into m, which is zero: fields it does not know, or of
// another wire type than it knows them by, are skipped as protobuf does.
func unmarshal(b []byte, m message) error {
	fs := m.fields()
	return ttrpclite.EachField(b, func(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
		for _, f := range fs {
			if f.num == num && f.typ == typ {
				return f.consume(b)
			}
		}
		return protowire.ConsumeFieldValue(num, typ, b), nil
	})
}

func varintField(num protowire.Number, get func() uint64, set func(uint64)) field {
	return field{
		num: num, typ: protowire.VarintType,
		append: func(b []byte) []byte {
			if v := get(); v != 0 {
				b = protowire.AppendTag(b, num, protowire.VarintType)
				b = protowire.AppendVarint(b, v)
			}
			return b
		},
		consume: func(b []byte) (int, error) {
			v, n := protowire.ConsumeVarint(b)
			if n >= 0 {
				set(v)
			}
			return n, nil
		},
	}
}

func uint32Field(num protowire.Number, p *uint32) field {
	return varintField(num, func() uint64 { return uint64(*p) }, func(v uint64) { *p = uint32(v) })
}

func uint64Field(num protowire.Number, p *uint64) field {
	return varintField(num, func() uint64 { return *p }, func(v uint64) { *p = v })
}

// int32Field encodes a negative value in ten bytes, sign-extended, as
// protobuf's int32 does.
func int32Field(num protowire.Number, p *int32) field {
	return varintField(num, func() uint64 { return uint64(int64(*p)) }, func(v uint64) { *p = int32(v) })
}

func int64Field(num protowire.Number, p *int64) field {
	return varintField(num, func() uint64 { return uint64(*p) }, func(v uint64) { *p = int64(v) })
}

func boolField(num protowire.Number, p *bool) field {
	return varintField(num, func() uint64 { return protowire.EncodeBool(*p) }, func(v uint64) { *p = protowire.DecodeBool(v) })
}

func statusField(num protowire.Number, p *Status) field {
	return varintField(num, func() uint64 { return uint64(int64(*p)) }, func(v uint64) { *p = Status(int32(v)) })
}

func bytesField(num protowire.Number, get func() []byte, set func([]byte)) field {
	return field{
		num: num, typ: protowire.BytesType,
		append: func(b []byte) []byte {
			if v := get(); len(v) > 0 {
				b = protowire.AppendTag(b, num, protowire.BytesType)
				b = protowire.AppendBytes(b, v)
			}
			return b
		},
		consume: func(b []byte) (int, error) {
			v, n := protowire.ConsumeBytes(b)
			if n >= 0 {
				set(v)
			}
			return n, nil
		},
	}
}

func stringField(num protowire.Number, p *string) field {
	return bytesField(num, func() []byte { return []byte(*p) }, func(v []byte) { *p = string(v) })
}

// repeatedStringField is a repeated string: one field per element, empty
// ones too, in order.
func repeatedStringField(num protowire.Number, p *[]string) field {
	return field{
		num: num, typ: protowire.BytesType,
		append: func(b []byte) []byte {
			for _, v := range *p {
				b = protowire.AppendTag(b, num, protowire.BytesType)
				b = protowire.AppendString(b, v)
			}
			return b
		},
		consume: func(b []byte) (int, error) {
			v, n := protowire.ConsumeString(b)
			if n >= 0 {
				*p = append(*p, v)
			}
			return n, nil
		},
	}
}

// dataField keeps a copy: the frame it was read from is not the message's.
func dataField(num protowire.Number, p *[]byte) field {
	return bytesField(num, func() []byte { return *p }, func(v []byte) { *p = append([]byte(nil), v...) })
}

// repeatedMessageField is a repeated message of type T: one field per
// element, each its encoding.
func repeatedMessageField[T any, PT interface {
	*T
	message
}](num protowire.Number, p *[]*T) field {
	return field{
		num: num, typ: protowire.BytesType,
		append: func(b []byte) []byte {
			for _, m := range *p {
				b = protowire.AppendTag(b, num, protowire.BytesType)
				b = protowire.AppendBytes(b, marshal(PT(m)))
			}
			return b
		},
		consume: func(b []byte) (int, error) {
			m, n, err := consumeMessage[T, PT](num, b)
			if m != nil {
				*p = append(*p, m)
			}
			return n, err
		},
	}
}

// messageField is a message of type T; nil is no field.
func messageField[T any, PT interface {
	*T
	message
}](num protowire.Number, p **T) field {
	return field{
		num: num, typ: protowire.BytesType,
		append: func(b []byte) []byte {
			if *p == nil {
				return b
			}
			b = protowire.AppendTag(b, num, protowire.BytesType)
			return protowire.AppendBytes(b, marshal(PT(*p)))
		},
		consume: func(b []byte) (int, error) {
			m, n, err := consumeMessage[T, PT](num, b)
			if m != nil {
				*p = m
			}
			return n, err
		},
	}
}

// consumeMessage reads a message of type T, field num, from the front of
// b: the message (nil when b is short, n < 0) and the bytes taken.
func consumeMessage[T any, PT interface {
	*T
	message
}](num protowire.Number, b []byte) (*T, int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return nil, n, nil
	}
	m := new(T)
	if err := unmarshal(v, PT(m)); err != nil {
		return nil, n, fmt.Errorf("field %d: %w", num, err)
	}
	return m, n, nil
}

// timestamp is google.protobuf.Timestamp: seconds = 1, nanos = 2.
type timestamp struct {
	seconds int64
	nanos   int32
}

func (t *timestamp) fields() []field {
	return []field{int64Field(1, &t.seconds), int32Field(2, &t.nanos)}
}

// timeField carries a time as a Timestamp; the zero time is no field, and
// no field reads as the zero time.
func timeField(num protowire.Number, p *time.Time) field {
	return field{
		num: num, typ: protowire.BytesType,
		append: func(b []byte) []byte {
			if p.IsZero() {
				return b
			}
			b = protowire.AppendTag(b, num, protowire.BytesType)
			return protowire.AppendBytes(b, marshal(&timestamp{seconds: p.Unix(), nanos: int32(p.Nanosecond())}))
		},
		consume: func(b []byte) (int, error) {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n, nil
			}
			var ts timestamp
			if err := unmarshal(v, &ts); err != nil {
				return n, fmt.Errorf("field %d (a Timestamp): %w", num, err)
			}
			*p = time.Unix(ts.seconds, int64(ts.nanos)).UTC()
			return n, nil
		},
	}
}

// Status is the run's state in StateResponse.
type Status int32

const (
	Status_STATUS_UNSPECIFIED Status = 0
	Status_CREATED            Status = 1 // serving, runtime not started yet
	Status_RUNNING            Status = 2
	Status_EXITED             Status = 3 // the exit is recorded in status.json
)

func (s Status) String() string {
	switch s {
	case Status_STATUS_UNSPECIFIED:
		return "STATUS_UNSPECIFIED"
	case Status_CREATED:
		return "CREATED"
	case Status_RUNNING:
		return "RUNNING"
	case Status_EXITED:
		return "EXITED"
	}
	return fmt.Sprintf("%d", int32(s))
}
