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
		{RequestId: "r", Kind: Chunk_KIND_ERROR, Error: &Error{Code: "engine_error", Message: "boom", HttpStatus: 500, Retryable: true}},
	}
}

// TestChunkRoundTrip: what AppendChunk appends after a prefix, DecodeChunk
// reads back, into a chunk that held another one before (a pooled chunk):
// nothing of the old chunk stays, and unknown fields are dropped.
func TestChunkRoundTrip(t *testing.T) {
	old := &Chunk{RequestId: "old", AgentId: "old", Kind: Chunk_KIND_TOKEN, Seq: 9, Secret: 1, Raw: []byte("old"),
		Events: []*Event{{Raw: []byte("old1"), DeltaText: "old1", FinishReason: "length"}, {Raw: []byte("old2")}, {DeltaText: "old3"}}}
	for i, c := range encodeChunks() {
		enc, err := AppendChunk([]byte("prefix"), c)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		body, ok := bytes.CutPrefix(enc, []byte("prefix"))
		if !ok {
			t.Fatalf("chunk %d: the prefix was not kept", i)
		}
		pooled := proto.Clone(old).(*Chunk)
		if err := DecodeChunk(append(body, 0xf8, 0x01, 0x01), pooled); err != nil { // field 31, varint 1: unknown
			t.Fatalf("chunk %d: %v", i, err)
		}
		if !proto.Equal(pooled, c) || len(pooled.ProtoReflect().GetUnknown()) != 0 {
			t.Fatalf("chunk %d: decoded %v, want %v", i, pooled, c)
		}
	}
	if _, err := AppendChunk(nil, &Chunk{AgentId: string([]byte{0xff})}); err == nil {
		t.Fatal("a string that is not UTF-8 was encoded")
	}
	if err := DecodeChunk([]byte{0x0a, 0x05, 'a'}, new(Chunk)); err == nil {
		t.Fatal("a truncated chunk was decoded")
	}
}
