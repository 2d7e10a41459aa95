//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package loadgen

import (
	"testing"
)

func TestScanEventAllocs(t *testing.T) {
	b := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}],"usage":null}`)
	if n := testing.AllocsPerRun(100, func() { scanEvent(b) }); n != 0 {
		t.Fatalf("scanEvent allocates %v times per chunk", n)
	}
}
