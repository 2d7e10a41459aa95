package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// fleetBatch is the batch part of a pool in GET /v1/fleet.
type fleetBatch struct {
	Models []struct {
		Pools []struct {
			Pool   string `json:"pool"`
			Active int    `json:"active"`
			Batch  struct {
				Queued    int     `json:"queued"`
				Running   int     `json:"running"`
				SlotShare float64 `json:"slot_share"`
			} `json:"batch"`
		} `json:"pools"`
	} `json:"models"`
}

func regularBatch(base string) (queued, running, active int, share float64, err error) {
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer resp.Body.Close()
	var f fleetBatch
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		return 0, 0, 0, 0, err
	}
	for _, m := range f.Models {
		for _, p := range m.Pools {
			if p.Pool == "regular" {
				return p.Batch.Queued, p.Batch.Running, p.Active, p.Batch.SlotShare, nil
			}
		}
	}
	return 0, 0, 0, 0, fmt.Errorf("no regular pool in the fleet view")
}

// TestFlexYieldsToInteractive: a flex load (service_tier "flex", batch
// class) fills an agent's every slot and leaves a backlog in its batch
// queue; the fleet view shows it as batch work, not as active slots. An
// interactive burst then starts at once: its streams' first tokens come
// while the flex backlog is still queued, the batch jobs they displaced
// are preempted and run again, and every flex request is answered exactly
// once, complete.
func TestFlexYieldsToInteractive(t *testing.T) {
	const slots, flex, burst, flexTokens = 2, 6, 2, 40
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Slots: 8})
	startAgent(t, b.NATS, "a1", e, slots, "--batch-reserve", "0")
	cmdtest.WaitEligible(t, b.HTTP, "a1")

	type answer struct {
		status int
		body   string
	}
	answers := make([]answer, flex)
	var flexDone atomic.Int32
	var wg sync.WaitGroup
	for i := range flex {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"flex %d"}],"max_tokens":%d,"service_tier":"flex"}`, model, i, flexTokens)
			resp, err := http.Post(b.HTTP+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				answers[i] = answer{body: err.Error()}
				return
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			answers[i] = answer{resp.StatusCode, string(data)}
			flexDone.Add(1)
		}()
	}
	// The flex load holds every slot, as batch work, with a backlog.
	testwait.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		q, r, active, share, err := regularBatch(b.HTTP)
		if err != nil {
			return err
		}
		if r != slots || q < 1 || active != 0 || share != 1 {
			return fmt.Errorf("batch queued %d running %d share %v, active %d; want %d running, a backlog, no interactive work", q, r, share, active, slots)
		}
		return nil
	})
	// The burst: each stream's first token comes while flex requests
	// are still waiting in the batch queue.
	var rests []<-chan streamResult
	for i := range burst {
		_, rest := openStream(t, b.HTTP, fmt.Sprintf("interactive %d", i), 20)
		rests = append(rests, rest)
	}
	if n := flexDone.Load(); n >= flex-slots {
		t.Fatalf("%d of %d flex requests had finished before the burst's first tokens: the burst waited behind batch work", n, flex)
	}
	for i, rest := range rests {
		select {
		case r := <-rest:
			if !r.done || r.errMsg != "" {
				t.Fatalf("interactive stream %d: %+v", i, r)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("interactive stream %d did not end", i)
		}
	}
	wg.Wait()
	for i, a := range answers {
		var resp struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if a.status != 200 || json.Unmarshal([]byte(a.body), &resp) != nil || len(resp.Choices) != 1 ||
			resp.Choices[0].FinishReason == "" || resp.Usage.CompletionTokens < 1 || resp.Usage.CompletionTokens > flexTokens {
			t.Fatalf("flex request %d: %d %s", i, a.status, a.body)
		}
	}
	// The burst displaced batch jobs: the broker ran them again.
	fams, err := scrape(b.HTTP)
	if err != nil {
		t.Fatal(err)
	}
	again := 0.0
	for _, m := range fams["switchyard_retries_total"].GetMetric() {
		again += m.GetCounter().GetValue()
	}
	for _, m := range fams["switchyard_migrations_total"].GetMetric() {
		again += m.GetCounter().GetValue()
	}
	if again < 1 {
		t.Fatal("no batch job was run again: the burst preempted none")
	}
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		q, r, _, _, err := regularBatch(b.HTTP)
		if err != nil || q != 0 || r != 0 {
			return fmt.Errorf("batch queued %d running %d, %v; want none left", q, r, err)
		}
		return nil
	})
}
