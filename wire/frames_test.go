package wire

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
)

func frameChunks() []*Chunk {
	return []*Chunk{
		{RequestId: "b1-1abcdef", Attempt: 0, Seq: 0, AgentId: "a1", Kind: Chunk_KIND_ACCEPTED, Secret: 0x1234567890abcdef},
		{RequestId: "b1-2ghijkl", Attempt: 1, Seq: 3, AgentId: "a1", Kind: Chunk_KIND_TOKEN, Secret: 7,
			Events: []*Event{{Raw: []byte(`{"choices":[{"index":0,"delta":{"content":"hi"}}]}`), DeltaText: "hi"}}},
		{RequestId: "b1-1abcdef", Attempt: 0, Seq: 1, AgentId: "a1", Kind: Chunk_KIND_FINAL, FinishReason: "stop", Secret: 0x1234567890abcdef,
			Usage: &Usage{PromptTokens: 3, CompletionTokens: 1, TotalTokens: 4}},
	}
}

func TestFramesRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []*Chunk
	}{
		{"one", frameChunks()[:1]},
		{"several requests", frameChunks()},
		{"empty chunk", []*Chunk{{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := []byte{FrameMarker}
			var err error
			for _, c := range tc.chunks {
				if buf, err = AppendFrame(buf, c); err != nil {
					t.Fatal(err)
				}
			}
			var got []*Chunk
			if err := Frames(buf, func(b []byte) error {
				c := new(Chunk)
				got = append(got, c)
				return proto.Unmarshal(b, c)
			}); err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.chunks) {
				t.Fatalf("%d chunks back, want %d", len(got), len(tc.chunks))
			}
			for i := range got {
				if !proto.Equal(got[i], tc.chunks[i]) {
					t.Errorf("chunk %d: got %v, want %v", i, got[i], tc.chunks[i])
				}
			}
		})
	}
}

func TestFramesBroken(t *testing.T) {
	good, _ := AppendFrame([]byte{FrameMarker}, frameChunks()[1])
	for _, tc := range []struct {
		name string
		data []byte
		want int // frames handed out before the error
	}{
		{"empty", nil, 0},
		{"a chunk without the marker", good[2:], 0},
		{"length beyond the end", append([]byte{FrameMarker}, 0x7f, 1, 2), 0},
		{"truncated varint", []byte{FrameMarker, 0x80}, 0},
		{"good then truncated", append(append([]byte(nil), good...), good[1:len(good)-1]...), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			err := Frames(tc.data, func([]byte) error { n++; return nil })
			if !errors.Is(err, ErrBadFrame) || n != tc.want {
				t.Fatalf("got %d frames, %v; want %d and ErrBadFrame", n, err, tc.want)
			}
		})
	}
}

func FuzzFrames(f *testing.F) {
	buf := []byte{FrameMarker}
	for _, c := range frameChunks() {
		buf, _ = AppendFrame(buf, c)
	}
	f.Add(buf)
	f.Add([]byte{FrameMarker, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		total := 0
		_ = Frames(data, func(b []byte) error {
			total += len(b)
			c := new(Chunk)
			_ = proto.Unmarshal(b, c)
			return nil
		})
		if total > len(data) {
			t.Fatalf("frames hold %d bytes of a %d-byte message", total, len(data))
		}
	})
}

func BenchmarkAppendFrame(b *testing.B) {
	c := frameChunks()[1]
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = AppendFrame(append(buf[:0], FrameMarker), c)
	}
}
