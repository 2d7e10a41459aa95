package wire

import (
	"bytes"
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

// decodeChunkCases are the chunks the decoder's tests and its fuzz target
// start from.
func decodeChunkCases() []struct {
	name  string
	chunk *Chunk
} {
	return []struct {
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
	}
}

func TestDecodeChunk(t *testing.T) {
	for _, tc := range decodeChunkCases() {
		t.Run(tc.name, func(t *testing.T) {
			data, err := proto.Marshal(tc.chunk)
			if err != nil {
				t.Fatal(err)
			}
			checkChunkCodec(t, data)
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
			checkChunkCodec(t, tc.data)
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

// checkChunkCodec holds DecodeChunk and AppendChunk to proto.Unmarshal and
// proto.Marshal on data: the same verdict, and the same chunk (but for the
// unknown fields DecodeChunk drops) whether decoded into a new chunk or
// into one that holds an earlier decode's events; and a chunk that
// proto.Unmarshal reads encodes to proto.Marshal's bytes.
func checkChunkCodec(t *testing.T, data []byte) {
	t.Helper()
	want := new(Chunk)
	perr := proto.Unmarshal(data, want)
	for _, got := range []*Chunk{new(Chunk), reusedChunk(t)} {
		err := DecodeChunk(data, got)
		if (err == nil) != (perr == nil) {
			t.Fatalf("DecodeChunk: %v; proto.Unmarshal: %v", err, perr)
		}
		if err != nil {
			continue
		}
		known := proto.Clone(want).(*Chunk)
		dropUnknown(known)
		if !proto.Equal(got, known) {
			t.Fatalf("DecodeChunk: %v\nproto.Unmarshal: %v", got, known)
		}
	}
	if perr != nil {
		return
	}
	enc, err := proto.Marshal(want)
	if err != nil {
		t.Fatalf("proto.Marshal of a decoded chunk: %v", err)
	}
	got, err := AppendChunk([]byte("prefix"), want)
	if err != nil || !bytes.Equal(got[len("prefix"):], enc) || string(got[:len("prefix")]) != "prefix" {
		t.Fatalf("AppendChunk = %x, %v; proto.Marshal = %x", got, err, enc)
	}
}

// FuzzDecodeChunk is the differential test of the broker's per-token
// decoder (and, on every chunk proto.Unmarshal accepts, of the agent's
// encoder) against protobuf-go, seeded from the unit tables.
func FuzzDecodeChunk(f *testing.F) {
	var chunks []*Chunk
	for _, tc := range decodeChunkCases() {
		chunks = append(chunks, tc.chunk)
	}
	for _, c := range append(chunks, encodeChunks()...) {
		data, err := proto.Marshal(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	withUnknown := &Chunk{RequestId: "r", Events: []*Event{{DeltaText: "x"}}}
	withUnknown.ProtoReflect().SetUnknown([]byte{0xf8, 0x01, 0x01}) // field 31, varint 1
	withUnknown.Events[0].ProtoReflect().SetUnknown([]byte{0x20, 0x05})
	data, err := proto.Marshal(withUnknown)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(data[:len(data)-3])
	job, _ := proto.Marshal(&Job{RequestId: "r1", Model: "m", Body: []byte(`{}`), Pd: &PDHandoff{BootstrapRoom: 7}})
	f.Add(job)
	f.Fuzz(checkChunkCodec)
}
