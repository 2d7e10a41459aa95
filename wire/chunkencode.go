package wire

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// AppendChunk appends the protobuf encoding of c to buf: the bytes
// proto.Marshal gives (fields in number order, zero values left out), and
// its refusal of a string that is not UTF-8, without its reflection. It is
// the agent's encoder for the chunks it sends, one per token or burst.
//
// A chunk with an Error, or with unknown fields anywhere, is left to
// proto.MarshalAppend: they are rare, and this encoder need not know them.
func AppendChunk(buf []byte, c *Chunk) ([]byte, error) {
	if c.Error != nil || len(c.unknownFields) > 0 || (c.Usage != nil && len(c.Usage.unknownFields) > 0) {
		return proto.MarshalOptions{}.MarshalAppend(buf, c)
	}
	for _, ev := range c.Events {
		if ev == nil || len(ev.unknownFields) > 0 {
			return proto.MarshalOptions{}.MarshalAppend(buf, c)
		}
	}
	// One growth of buf at most: an agent's buffer starts empty per job.
	n := 64 + len(c.RequestId) + len(c.AgentId) + len(c.Raw) + len(c.FinishReason) + len(c.PrefillAgent)
	for _, ev := range c.Events {
		n += 16 + len(ev.Raw) + len(ev.DeltaText) + len(ev.FinishReason)
	}
	buf = grow(buf, n)
	var err error
	if buf, err = appendString(buf, 1, c.RequestId); err != nil {
		return buf, err
	}
	buf = appendVarint(buf, 2, uint64(c.Attempt))
	buf = appendVarint(buf, 3, c.Seq)
	if buf, err = appendString(buf, 4, c.AgentId); err != nil {
		return buf, err
	}
	buf = appendVarint(buf, 5, uint64(int64(c.Kind)))
	buf = appendBytes(buf, 6, c.Raw)
	if buf, err = appendString(buf, 8, c.FinishReason); err != nil {
		return buf, err
	}
	if u := c.Usage; u != nil {
		buf = protowire.AppendTag(buf, 9, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(varintSize(1, uint64(u.PromptTokens))+varintSize(2, uint64(u.CompletionTokens))+varintSize(3, uint64(u.TotalTokens))))
		buf = appendVarint(buf, 1, uint64(u.PromptTokens))
		buf = appendVarint(buf, 2, uint64(u.CompletionTokens))
		buf = appendVarint(buf, 3, uint64(u.TotalTokens))
	}
	if buf, err = appendString(buf, 11, c.PrefillAgent); err != nil {
		return buf, err
	}
	buf = appendVarint(buf, 12, uint64(int64(c.Stage)))
	for _, ev := range c.Events {
		buf = protowire.AppendTag(buf, 13, protowire.BytesType)
		buf = protowire.AppendVarint(buf, uint64(bytesSize(1, len(ev.Raw))+bytesSize(2, len(ev.DeltaText))+bytesSize(3, len(ev.FinishReason))))
		buf = appendBytes(buf, 1, ev.Raw)
		if buf, err = appendString(buf, 2, ev.DeltaText); err != nil {
			return buf, err
		}
		if buf, err = appendString(buf, 3, ev.FinishReason); err != nil {
			return buf, err
		}
	}
	if c.Secret != 0 {
		buf = protowire.AppendTag(buf, 14, protowire.Fixed64Type)
		buf = protowire.AppendFixed64(buf, c.Secret)
	}
	return buf, nil
}

// grow returns buf with room for n more bytes, in one allocation at most
// (slices.Grow allocates twice under the race detector).
func grow(buf []byte, n int) []byte {
	if cap(buf)-len(buf) >= n {
		return buf
	}
	grown := make([]byte, len(buf), len(buf)+n)
	copy(grown, buf)
	return grown
}

// appendVarint appends field num unless v is its zero value.
func appendVarint(buf []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return buf
	}
	buf = protowire.AppendTag(buf, num, protowire.VarintType)
	return protowire.AppendVarint(buf, v)
}

func appendBytes(buf []byte, num protowire.Number, b []byte) []byte {
	if len(b) == 0 {
		return buf
	}
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(len(b)))
	return append(buf, b...)
}

func appendString(buf []byte, num protowire.Number, s string) ([]byte, error) {
	if s == "" {
		return buf, nil
	}
	if !utf8.ValidString(s) {
		return buf, errInvalidUTF8
	}
	buf = protowire.AppendTag(buf, num, protowire.BytesType)
	buf = protowire.AppendVarint(buf, uint64(len(s)))
	return append(buf, s...), nil
}

// varintSize is the size of field num holding v, 0 for the zero value.
func varintSize(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

// bytesSize is the size of field num holding n bytes, 0 when empty.
func bytesSize(num protowire.Number, n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}
