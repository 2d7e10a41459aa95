package broker

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// clientTally is what reached the client, across attempts: the text a
// migration continues from, the token timings and counts the metrics
// and the request's log line report, and its outcome. The reader owns
// every field; no lock.
type clientTally struct {
	sent       strings.Builder // the text handed to the client so far
	sentTokens int             // content chunks handed to the client before the current attempt
	streamID   string          // the engine's chunk id of the first attempt, kept across migrations
	reasoned   bool            // reasoning text reached the client (see migrate)
	firstToken time.Time
	lastToken  time.Time
	tokens     int
	outcome    string
	itl        prometheus.Observer
	itlRoute   dispatch.Route
}

// first records the first token, handed to the client at now in events,
// and reports whether it was the first: the stream's chunk id is kept
// for the migrations after it.
func (t *clientTally) first(now time.Time, events []*wire.Event) bool {
	if !t.firstToken.IsZero() {
		return false
	}
	t.firstToken = now
	t.streamID = oaiformat.ChunkID(events[0].GetRaw())
	return true
}

// gaps observes the inter-token latency of n tokens handed to the client
// together at now on itl (the caller's, looked up for the route), and
// moves the last token to now.
func (t *clientTally) gaps(now time.Time, n int) {
	if !t.lastToken.IsZero() {
		t.itl.Observe(now.Sub(t.lastToken).Seconds())
	}
	// The events of one message reach the client together.
	for range n - 1 {
		t.itl.Observe(0)
	}
	t.lastToken = now
}

// sentFirstRoom is what a call's sent text is first given (see text).
const sentFirstRoom = 256

// text adds what events hand the client to the text a migration
// continues from, counts their tokens, and notes reasoning text.
func (t *clientTally) text(events []*wire.Event) {
	for _, ev := range events {
		if d := ev.GetDeltaText(); d != "" {
			if t.sent.Cap() == 0 {
				// Room for some 50 tokens at once, where growing from the
				// first token's few bytes took an allocation at each
				// doubling.
				t.sent.Grow(max(sentFirstRoom, len(d)))
			}
			t.sent.WriteString(d)
			t.tokens++
		} else if !t.reasoned && ev.GetFinishReason() == "" {
			t.reasoned = oaiformat.Reasoning(ev.GetRaw())
		}
	}
}
