package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/wire"
)

// The in-process simulator with the batch model streams what Expect says,
// for requests that share its steps.
func TestStreamBatchModel(t *testing.T) {
	cfg := simengine.DefaultConfig()
	cfg.Slots = 3 // the rest wait for a slot
	cfg.Batch = simengine.BatchModel{Enabled: true, MaxBatchedTokens: 4,
		StepTime: 100 * time.Microsecond, StepPerSeq: 10 * time.Microsecond, StepPerPrefillToken: time.Microsecond}
	e, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := New(e)
	var wg sync.WaitGroup
	for i := range 6 {
		body := fmt.Sprintf(`{"model":"sim-model","prompt":"request %d %s","max_tokens":%d,"stream":true}`, i, strings.Repeat("word ", 3*i), 5+4*i)
		wg.Go(func() {
			var text strings.Builder
			err := a.Stream(t.Context(), &agent.Request{API: wire.API_API_COMPLETION, Body: []byte(body)}, func(c []byte, _ bool) error {
				var ch struct {
					Choices []struct {
						Text string `json:"text"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(c, &ch); err != nil {
					return err
				}
				for _, c := range ch.Choices {
					text.WriteString(c.Text)
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s: %v", body, err)
				return
			}
			x, err := simengine.Expect(simengine.APICompletion, []byte(body))
			if err != nil {
				t.Errorf("Expect: %v", err)
				return
			}
			if text.String() != x.Text {
				t.Errorf("%s: got %q, want %q", body, text.String(), x.Text)
			}
		})
	}
	wg.Wait()
	if l := e.Load(); l.Running != 0 || l.Waiting != 0 {
		t.Fatalf("load after the requests: %+v", l)
	}
}
