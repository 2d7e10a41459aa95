//go:build !race

// Allocation guards: the race detector moves values to the heap and
// drops part of what goes into a sync.Pool, so these run without it.

package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/wire"
)

// Relaying a token chunk, from its reply message to the reader's Next,
// allocates nothing beyond protobuf-go's decode of the chunk: the chunk
// is decoded into one an earlier reader gave back (at its next Next). The
// bound is the decode's own count; one allocation more per chunk is
// already a regression.
func TestReplyTokenAllocs(t *testing.T) {
	br, c, m := hopCall(t, 1)
	c.Deadline = time.Now().Add(time.Hour)
	ctx := context.Background()
	decode := decodeAllocs(t, m)
	allocs := testing.AllocsPerRun(200, func() {
		c.nextSeq = 0
		br.onReply(m)
		if _, err := c.Next(ctx); err != nil {
			t.Fatal(err)
		}
	})
	c.Close()
	if allocs > decode {
		t.Fatalf("onReply and Next: %.1f allocations per token chunk, want no more than its decode's %.1f", allocs, decode)
	}
}

// TestSentTextAllocs: the text a call hands its client, kept for a
// migration, is given room for some 50 tokens at its first: 40 tokens
// cost one allocation beyond their decodes, where growing from the first
// token's bytes costs one per doubling (six).
func TestSentTextAllocs(t *testing.T) {
	br, c, m := hopCall(t, 1)
	c.Deadline = time.Now().Add(time.Hour)
	ctx := context.Background()
	decode := decodeAllocs(t, m)
	allocs := testing.AllocsPerRun(200, func() {
		c.sent = strings.Builder{}
		c.nextSeq = 0
		for range 40 {
			br.onReply(m)
			c.nextSeq = 0
			if _, err := c.Next(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	c.Close()
	if got := c.sent.String(); got != strings.Repeat(" word", 40) {
		t.Fatalf("sent text %q", got)
	}
	if allocs > 3+40*decode {
		t.Fatalf("40 tokens: %.1f allocations beyond their decodes' %.1f, want about 1 (growing by doubling is 6)", allocs-40*decode, 40*decode)
	}
}

// decodeAllocs is what decoding the chunk of reply message m allocates.
func decodeAllocs(t *testing.T, m *nats.Msg) float64 {
	t.Helper()
	var enc []byte
	if err := wire.Frames(m.Data, func(b []byte) error { enc = b; return nil }); err != nil || enc == nil {
		t.Fatalf("reply message: %v", err)
	}
	c := new(wire.Chunk)
	return testing.AllocsPerRun(200, func() {
		if err := wire.DecodeChunk(enc, c); err != nil {
			t.Fatal(err)
		}
	})
}

// A request id is made in one allocation.
func TestNewRequestIDAllocs(t *testing.T) {
	b := &Broker{cfg: Config{ID: "b7"}}
	if n := testing.AllocsPerRun(100, func() { _ = b.newRequestID() }); n > 1 {
		t.Fatalf("a request id: %.1f allocations, want 1", n)
	}
}
