package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestDispatchPublishSeconds: each dispatched attempt is timed once, from
// its decision to its job stored, on the broker's /metrics.
func TestDispatchPublishSeconds(t *testing.T) {
	b := cmdtest.StartBroker(t)
	startAgent(t, b.NATS, "a1", startEngine(t, simengineConfig(model)), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	for range 2 {
		resp, err := http.Post(b.HTTP+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		if v := scrapeValue(b.HTTP+"/metrics", "switchyard_dispatch_publish_seconds_count"); v != "2" {
			return fmt.Errorf("switchyard_dispatch_publish_seconds_count = %q, want 2", v)
		}
		return nil
	})
	sum, err := strconv.ParseFloat(scrapeValue(b.HTTP+"/metrics", "switchyard_dispatch_publish_seconds_sum"), 64)
	if err != nil || sum <= 0 || sum > 30 {
		t.Fatalf("switchyard_dispatch_publish_seconds_sum = %v (%v), want a positive time", sum, err)
	}
}
