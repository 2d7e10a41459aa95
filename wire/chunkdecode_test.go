package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// reusedChunk returns a chunk as the broker's pool hands it out: holding
// the events of an earlier, larger decode.
func reusedChunk(t testing.TB) *Chunk {
	t.Helper()
	c := new(Chunk)
	data, err := proto.Marshal(&Chunk{RequestId: "old", AgentId: "old", Kind: Chunk_KIND_TOKEN, Seq: 9, Secret: 1, Raw: []byte("old"),
		Events: []*Event{{Raw: []byte("old1"), DeltaText: "old1", FinishReason: "length"}, {Raw: []byte("old2")}, {DeltaText: "old3"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := DecodeChunk(data, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// dropUnknown clears the unknown fields DecodeChunk does not keep.
func dropUnknown(c *Chunk) {
	c.ProtoReflect().SetUnknown(nil)
	for _, ev := range c.GetEvents() {
		ev.ProtoReflect().SetUnknown(nil)
	}
}

func TestDecodeChunk(t *testing.T) {
	for _, tc := range []struct {
		name  string
		chunk *Chunk
	}{
		{"empty", &Chunk{}},
		{"accepted", frameChunks()[0]},
		{"token", frameChunks()[1]},
		{"final", frameChunks()[2]},
		{"events", &Chunk{RequestId: "b1-2", AgentId: "a1", Kind: Chunk_KIND_TOKEN, Seq: 1 << 40, Attempt: 3, Secret: ^uint64(0),
			Events: []*Event{{Raw: []byte(`{"a":1}`), DeltaText: "héllo"}, {}, {Raw: []byte(`{"a":2}`), FinishReason: "stop"}}}},
		{"error", &Chunk{RequestId: "b1-3", Kind: Chunk_KIND_ERROR, Stage: Chunk_STAGE_PREFILL, PrefillAgent: "p1",
			Error: &Error{Code: CodeEngine, Message: "boom", HttpStatus: 502, Retryable: true}, Raw: []byte(`{"error":{}}`)}},
		{"negative kind", &Chunk{Kind: Chunk_Kind(-3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := proto.Marshal(tc.chunk)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []*Chunk{new(Chunk), reusedChunk(t)} {
				if err := DecodeChunk(data, c); err != nil {
					t.Fatal(err)
				}
				if !proto.Equal(c, tc.chunk) {
					t.Fatalf("got %v, want %v", c, tc.chunk)
				}
				for _, ev := range c.GetEvents() {
					if raw := ev.GetRaw(); cap(raw) != len(raw) {
						t.Fatalf("event raw has spare capacity %d: an append would write into the message", cap(raw)-len(raw))
					}
				}
			}
		})
	}
}

// A chunk's events are decoded into the Event values an earlier decode
// left in the slice's capacity.
func TestDecodeChunkReusesEvents(t *testing.T) {
	c := reusedChunk(t)
	first := c.Events[0]
	data, err := proto.Marshal(frameChunks()[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := DecodeChunk(data, c); err != nil {
		t.Fatal(err)
	}
	if len(c.Events) != 1 || c.Events[0] != first {
		t.Fatalf("events not reused: %d events, first %p, was %p", len(c.Events), c.Events[0], first)
	}
	if c.Events[0].GetFinishReason() != "" {
		t.Fatalf("a reused event kept its old finish reason %q", c.Events[0].GetFinishReason())
	}
	// The strings alias the data: no copy per chunk.
	if allocs := testing.AllocsPerRun(100, func() { _ = DecodeChunk(data, c) }); allocs != 0 {
		t.Fatalf("DecodeChunk of a token chunk: %.1f allocations, want 0", allocs)
	}
}

func TestDecodeChunkRefuses(t *testing.T) {
	token, _ := proto.Marshal(frameChunks()[1])
	badUTF8, _ := proto.Marshal(&Chunk{AgentId: "ab"})
	badUTF8[len(badUTF8)-1] = 0xff
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"truncated", token[:len(token)-2]},
		{"invalid UTF-8", badUTF8},
		{"field number 0", []byte{0x02, 0x00}},
		{"end group alone", []byte{0x0c}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if proto.Unmarshal(tc.data, new(Chunk)) == nil {
				t.Fatal("proto.Unmarshal accepts it: not a case to refuse")
			}
			if err := DecodeChunk(tc.data, reusedChunk(t)); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func BenchmarkDecodeChunk(b *testing.B) {
	data, err := proto.Marshal(frameChunks()[1])
	if err != nil {
		b.Fatal(err)
	}
	b.Run("DecodeChunk", func(b *testing.B) {
		c := new(Chunk)
		b.ReportAllocs()
		for b.Loop() {
			if err := DecodeChunk(data, c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(data, new(Chunk)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
