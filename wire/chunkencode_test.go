package wire

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
)

func encodeChunks() []*Chunk {
	return []*Chunk{
		{},
		{RequestId: "b1-1abc", Attempt: 1, Seq: 0, AgentId: "a1", Kind: Chunk_KIND_ACCEPTED, Secret: 0xdeadbeefcafe},
		{RequestId: "b1-1abc", Seq: 7, AgentId: "a1", Kind: Chunk_KIND_TOKEN, Secret: 1, Events: []*Event{
			{Raw: []byte(`{"id":"c1","choices":[{"delta":{"content":"Hi"}}]}`), DeltaText: "Hi"},
			{Raw: []byte(`{"choices":[{"delta":{},"finish_reason":"stop"}]}`), FinishReason: "stop"},
			{},
		}},
		{RequestId: "r", Kind: Chunk_KIND_FINAL, Raw: []byte(`{"usage":{}}`), FinishReason: "length",
			Usage: &Usage{PromptTokens: 300, CompletionTokens: 1 << 20}, PrefillAgent: "p1", Stage: Chunk_STAGE_PREFILL},
		{RequestId: "r", Kind: Chunk_KIND_FINAL, Usage: &Usage{}},
		{RequestId: "r", Kind: Chunk_Kind(-3), Stage: Chunk_Stage(99), Seq: ^uint64(0), Attempt: ^uint32(0)},
		{RequestId: "r", Kind: Chunk_KIND_ERROR, Error: &Error{Code: "engine_error", Message: "boom", HttpStatus: 500, Retryable: true}},
	}
}

// TestAppendChunk: the same bytes as proto.Marshal, including what it
// leaves to it (an Error, unknown fields).
func TestAppendChunk(t *testing.T) {
	withUnknown := &Chunk{RequestId: "r"}
	withUnknown.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01}) // field 31, varint 1
	for i, c := range append(encodeChunks(), withUnknown) {
		want, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := AppendChunk([]byte("prefix"), c)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if !bytes.Equal(got[len("prefix"):], want) || !bytes.HasPrefix(got, []byte("prefix")) {
			t.Fatalf("chunk %d: AppendChunk = %x, proto.Marshal = %x", i, got, want)
		}
	}
}

// TestAppendChunkInvalidUTF8: a string that is not UTF-8 is refused, as
// proto.Marshal refuses it, wherever it is.
func TestAppendChunkInvalidUTF8(t *testing.T) {
	bad := string([]byte{0xff, 'x'})
	for _, c := range []*Chunk{
		{RequestId: bad},
		{AgentId: bad},
		{FinishReason: bad},
		{PrefillAgent: bad},
		{Events: []*Event{{DeltaText: bad}}},
		{Events: []*Event{{FinishReason: bad}}},
	} {
		if _, err := proto.Marshal(c); err == nil {
			t.Fatalf("proto.Marshal took %v", c)
		}
		if _, err := AppendChunk(nil, c); err == nil {
			t.Fatalf("AppendChunk took %v", c)
		}
	}
	if _, err := AppendChunk(nil, &Chunk{Events: []*Event{{Raw: []byte{0xff}}}}); err != nil {
		t.Fatalf("raw bytes need not be UTF-8: %v", err)
	}
}

func FuzzAppendChunk(f *testing.F) {
	f.Add("b1-1abc", uint32(1), uint64(3), "a1", int32(2), []byte(`{"x":1}`), "hi", "", uint64(9), true, uint8(2), uint32(5))
	f.Add("", uint32(0), uint64(0), "", int32(-1), []byte(nil), "", "stop", uint64(0), false, uint8(0), uint32(0))
	f.Fuzz(func(t *testing.T, id string, attempt uint32, seq uint64, agent string, kind int32, raw []byte, delta, finish string, secret uint64, usage bool, events uint8, tokens uint32) {
		c := &Chunk{RequestId: id, Attempt: attempt, Seq: seq, AgentId: agent, Kind: Chunk_Kind(kind), Raw: raw,
			FinishReason: finish, PrefillAgent: delta, Stage: Chunk_Stage(kind / 2), Secret: secret}
		if usage {
			c.Usage = &Usage{PromptTokens: tokens, CompletionTokens: tokens / 3, TotalTokens: tokens + tokens/3}
		}
		for i := range int(events % 8) {
			ev := &Event{Raw: raw, DeltaText: delta, FinishReason: finish}
			if i%2 == 1 {
				ev = &Event{DeltaText: id}
			}
			c.Events = append(c.Events, ev)
		}
		want, werr := proto.Marshal(c)
		got, gerr := AppendChunk(nil, c)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto.Marshal error %v, AppendChunk error %v", werr, gerr)
		}
		if werr == nil && !bytes.Equal(got, want) {
			t.Fatalf("AppendChunk = %x, proto.Marshal = %x", got, want)
		}
	})
}

func BenchmarkEncodeChunk(b *testing.B) {
	c := encodeChunks()[2]
	c.Events = c.Events[:1]
	buf := make([]byte, 0, 512)
	b.Run("proto.MarshalAppend", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			buf, _ = proto.MarshalOptions{}.MarshalAppend(buf[:0], c)
		}
	})
	b.Run("AppendChunk", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			buf, _ = AppendChunk(buf[:0], c)
		}
	})
}
