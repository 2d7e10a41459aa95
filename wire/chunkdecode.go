package wire

import (
	"errors"
	"unicode/utf8"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// errInvalidUTF8 is proto.Unmarshal's refusal of a string field that is
// not UTF-8, which proto3 requires.
var errInvalidUTF8 = errors.New("wire: string field contains invalid UTF-8")

// DecodeChunk decodes the protobuf encoding of a Chunk into c, as
// proto.Unmarshal would but without allocating per chunk: it reuses c's
// events (the slice and the Event values in its capacity), and the chunk's
// strings and bytes alias data instead of being copied. It is the broker's
// decoder for the chunks it relays, one per token.
//
// data must not change afterwards, for as long as any string or byte slice
// taken from c is in use: a NATS message's data, which the subscription
// hands over and nobody writes, is such a buffer. Whoever keeps a string
// for long (an agent id for a request's lifetime) should copy it, or the
// whole message stays in memory with it. Byte slices are capped at their
// length, so an append to one never writes into data.
//
// Usage and Error, which end an attempt, are decoded by proto.Unmarshal
// into new values, so that they may be kept. Unknown fields are dropped.
// On error c holds part of data.
func DecodeChunk(data []byte, c *Chunk) error {
	events := c.Events[:0]
	*c = Chunk{Events: events} // empty, with the capacity of the last decode
	for len(data) > 0 {
		num, typ, n := consumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		switch {
		case typ == protowire.VarintType && (num == 2 || num == 3 || num == 5 || num == 12):
			v, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			switch num {
			case 2:
				c.Attempt = uint32(v)
			case 3:
				c.Seq = v
			case 5:
				c.Kind = Chunk_Kind(int32(v))
			case 12:
				c.Stage = Chunk_Stage(int32(v))
			}
		case typ == protowire.Fixed64Type && num == 14:
			v, n := protowire.ConsumeFixed64(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			c.Secret = v
		case typ == protowire.BytesType && num >= 1 && num <= 13 && num != 2 && num != 3 && num != 5 && num != 7 && num != 12:
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			var err error
			switch num {
			case 1:
				c.RequestId, err = aliasString(v)
			case 4:
				c.AgentId, err = aliasString(v)
			case 6:
				c.Raw = aliasBytes(v)
			case 8:
				c.FinishReason, err = aliasString(v)
			case 9:
				if c.Usage == nil {
					c.Usage = new(Usage)
				}
				err = proto.UnmarshalOptions{Merge: true}.Unmarshal(v, c.Usage)
			case 10:
				if c.Error == nil {
					c.Error = new(Error)
				}
				err = proto.UnmarshalOptions{Merge: true}.Unmarshal(v, c.Error)
			case 11:
				c.PrefillAgent, err = aliasString(v)
			case 13:
				err = decodeEvent(v, c.nextEvent())
			}
			if err != nil {
				return err
			}
		default:
			// Unknown, or a known number with another wire type, which
			// proto.Unmarshal keeps as an unknown field.
			n := protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
		}
	}
	return nil
}

// nextEvent appends an event to c's, reusing one from an earlier decode
// when the slice's capacity holds one.
func (c *Chunk) nextEvent() *Event {
	i := len(c.Events)
	if i < cap(c.Events) {
		c.Events = c.Events[:i+1]
	} else {
		c.Events = append(c.Events, nil)
	}
	ev := c.Events[i]
	if ev == nil {
		ev = new(Event)
		c.Events[i] = ev
	}
	return ev
}

func decodeEvent(data []byte, ev *Event) error {
	*ev = Event{}
	for len(data) > 0 {
		num, typ, n := consumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if typ != protowire.BytesType || num < 1 || num > 3 {
			n := protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return protowire.ParseError(n)
			}
			data = data[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		var err error
		switch num {
		case 1:
			ev.Raw = aliasBytes(v)
		case 2:
			ev.DeltaText, err = aliasString(v)
		case 3:
			ev.FinishReason, err = aliasString(v)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// aliasString returns b as a string without copying it: b is part of a
// buffer DecodeChunk's caller promises never to change.
func aliasString(b []byte) (string, error) {
	if len(b) == 0 {
		return "", nil
	}
	if !utf8.Valid(b) {
		return "", errInvalidUTF8
	}
	return unsafe.String(&b[0], len(b)), nil
}

// aliasBytes returns b capped at its length; empty is not nil, as
// proto.Unmarshal leaves it.
func aliasBytes(b []byte) []byte {
	if len(b) == 0 {
		return []byte{}
	}
	return b[:len(b):len(b)]
}

// consumeTag is protowire.ConsumeTag that also refuses a field number
// beyond the valid range, as proto.Unmarshal does.
func consumeTag(data []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(data)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}
