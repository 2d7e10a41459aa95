//go:build !race

// Heavy hostile-engine cases, too slow under the race detector.

package e2e

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
)

// TestHostileEngineTinyEvents: an engine that answers a client waiting
// for a whole answer with hundreds of thousands of one-byte events, as
// fast as it can, is answered in full: an answer read whole is bounded by
// its bytes, not ended as a slow reader because its events outpace the
// assembly.
func TestHostileEngineTinyEvents(t *testing.T) {
	const events = 300_000
	b := cmdtest.StartBroker(t)
	var ends engineEnds
	e := hostileEngine(t, endless(1, events, &ends))
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	peak := heapPeak(t)
	st, data := postChat(t, b.HTTP, false)
	grown := peak()
	var got struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &got); err != nil || st != http.StatusOK || len(got.Choices) != 1 || len(got.Choices[0].Message.Content) != events {
		t.Fatalf("client got %d %.300s (%v), want 200 with %d bytes of content", st, data, err, events)
	}
	t.Logf("heap grew by %d MiB", grown/mib)
}
