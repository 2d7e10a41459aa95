//go:build !race

// Allocation guards: the race detector moves values to the heap and
// drops part of what goes into a sync.Pool, so these run without it.

package broker

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Relaying a token chunk, from its reply message to the reader's Next,
// allocates nothing: the chunk is decoded into one an earlier reader gave
// back (at its next Next), its bytes and strings are the message's. The
// bound leaves room for the runtime; one allocation per chunk is already
// a regression.
func TestReplyTokenAllocs(t *testing.T) {
	br, c, m := hopCall(t, 1)
	c.Deadline = time.Now().Add(time.Hour)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		c.nextSeq = 0
		br.onReply(m)
		if _, err := c.Next(ctx); err != nil {
			t.Fatal(err)
		}
	})
	c.Close()
	if allocs >= 1 {
		t.Fatalf("onReply and Next: %.1f allocations per token chunk, want none", allocs)
	}
}

// TestSentTextAllocs: the text a call hands its client, kept for a
// migration, is given room for some 50 tokens at its first: 40 tokens
// cost one allocation, where growing from the first token's bytes costs
// one per doubling (six).
func TestSentTextAllocs(t *testing.T) {
	br, c, m := hopCall(t, 1)
	c.Deadline = time.Now().Add(time.Hour)
	ctx := context.Background()
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
	if allocs > 3 {
		t.Fatalf("40 tokens: %.1f allocations, want about 1 (growing by doubling is 6)", allocs)
	}
}

// A request id is made in one allocation.
func TestNewRequestIDAllocs(t *testing.T) {
	b := &Broker{cfg: Config{ID: "b7"}}
	if n := testing.AllocsPerRun(100, func() { _ = b.newRequestID() }); n > 1 {
		t.Fatalf("a request id: %.1f allocations, want 1", n)
	}
}
