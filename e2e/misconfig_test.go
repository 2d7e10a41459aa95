package e2e

import (
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"

	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/switchyard-ai/switchyard/simengine"
)

// fleetAgentState is an agent's state and reason in GET /v1/fleet.
type fleetAgentState struct {
	ID          string `json:"id"`
	State       string `json:"state"`
	Eligible    bool   `json:"eligible"`
	StateReason string `json:"state_reason"`
}

func agentState(t testing.TB, base, id string) (fleetAgentState, error) {
	t.Helper()
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return fleetAgentState{}, err
	}
	defer resp.Body.Close()
	var f struct {
		Agents []fleetAgentState `json:"agents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		return fleetAgentState{}, err
	}
	for _, a := range f.Agents {
		if a.ID == id {
			return a, nil
		}
	}
	return fleetAgentState{}, fmt.Errorf("agent %s not in the fleet", id)
}

// waitReason waits until agent id is in state with a state_reason holding
// every want.
func waitReason(t testing.TB, base, id, state string, want ...string) fleetAgentState {
	t.Helper()
	var got fleetAgentState
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		var err error
		if got, err = agentState(t, base, id); err != nil {
			return err
		}
		if got.State != state {
			return fmt.Errorf("agent %s: %+v, want state %s", id, got, state)
		}
		for _, w := range want {
			if !strings.Contains(got.StateReason, w) {
				return fmt.Errorf("agent %s: reason %q lacks %q", id, got.StateReason, w)
			}
		}
		return nil
	})
	return got
}

// TestEngineRefusesAgentAtStart: an agent whose engine refuses its key, or
// serves another model, never becomes ready, and the fleet view says why.
func TestEngineRefusesAgentAtStart(t *testing.T) {
	b := cmdtest.StartBroker(t)
	good := fastEngine(t, 4)
	startAgent(t, b.NATS, "good", good, 4)
	cmdtest.WaitEligible(t, b.HTTP, "good")
	for _, tc := range []struct {
		name      string
		engineKey string // the key the engine demands
		args      []string
		want      []string
	}{
		{name: "wrong key", engineKey: "right", args: []string{"--engine-api-key", "wrong", "--model", model},
			want: []string{"401", "--engine-api-key"}},
		{name: "no key", engineKey: "right", args: []string{"--model", model},
			want: []string{"401", "--engine-api-key"}},
		{name: "other model", args: []string{"--model", "meta-llama/Llama-3.1-8B"},
			want: []string{`not "meta-llama/Llama-3.1-8B"`, "--model"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spy := startKeySpy(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4}, tc.engineKey)
			id := strings.ReplaceAll(tc.name, " ", "-")
			// Not startAgent, which waits for ready: this one never is.
			p := cmdtest.Start(t, agentcmd.Run, append([]string{"--nats-url", b.NATS, "--engine", "openai", "--engine-url", spy.URL, "--id", id,
				"--slots", "4", "--heartbeat", liveHeartbeat, "--log-level", "warn", "--slow-start", "0"}, tc.args...)...)
			// Whether a warming agent counts in the weights is the
			// dispatch rule's business; here it must not pull.
			waitReason(t, b.HTTP, id, "warming", tc.want...)
			// The agent is not serving, so every request goes to the good one.
			client := sdk(b.HTTP)
			for i := range 5 {
				if _, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
					Model: openai.CompletionNewParamsModel(model), Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprint("hello ", i))},
					MaxTokens: openai.Int(3),
				}); err != nil {
					t.Fatal(err)
				}
			}
			if n := spy.count(http.MethodPost, "/v1/completions", http.StatusOK) + spy.count(http.MethodPost, "/v1/completions", http.StatusUnauthorized); n != 0 {
				t.Fatalf("a refused agent sent %d requests to its engine", n)
			}
			if !strings.Contains(p.Err.String(), "engine refuses the agent") {
				t.Fatalf("no loud log line; stderr:\n%s", p.Err.String())
			}
		})
	}
}

// TestEngineRefusesAgentAtRun: an engine whose key changes under a serving
// agent answers 401. The client never sees it: the request is retried on
// the other agent; the refused agent leaves service with the reason in
// /v1/fleet, stops pulling, and comes back once the engine takes its key.
func TestEngineRefusesAgentAtRun(t *testing.T) {
	b := cmdtest.StartBroker(t)
	spy := startKeySpy(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 4}, "k1")
	good := fastEngine(t, 4)
	startAgent(t, b.NATS, "spied", &engine{URL: spy.URL}, 4, "--engine-api-key", "k1", "--model", model)
	startAgent(t, b.NATS, "good", good, 4)
	cmdtest.WaitEligible(t, b.HTTP, "spied", "good")

	spy.setKey("k2") // rotated on the engine, not on the agent
	client := sdk(b.HTTP)
	ctx := context.Background()
	sent := 0
	for ; spy.count(http.MethodPost, "/v1/chat/completions", http.StatusUnauthorized) == 0; sent++ {
		if sent == 200 {
			t.Fatal("no request reached the spied engine in 200")
		}
		stream := sent%2 == 0
		params := openai.ChatCompletionNewParams{
			Model:     model,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("request ", sent))},
			MaxTokens: openai.Int(4),
		}
		if stream {
			s := client.Chat.Completions.NewStreaming(ctx, params)
			n := 0
			for s.Next() {
				n++
			}
			if err := s.Err(); err != nil || n == 0 {
				t.Fatalf("request %d (stream): %v after %d chunks", sent, err, n)
			}
			continue
		}
		got, err := client.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatalf("request %d: %v", sent, err)
		}
		if got.Choices[0].Message.Content == "" {
			t.Fatalf("request %d: empty answer", sent)
		}
	}
	waitReason(t, b.HTTP, "spied", "warming", "401", "--engine-api-key")
	// Out of service: the engine sees probes, never another request.
	before := spy.count(http.MethodPost, "/v1/chat/completions", http.StatusUnauthorized)
	for i := range 10 {
		if _, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprint("after ", i))}, MaxTokens: openai.Int(2),
		}); err != nil {
			t.Fatalf("request while out of service: %v", err)
		}
	}
	if after := spy.count(http.MethodPost, "/v1/chat/completions", http.StatusUnauthorized); after != before {
		t.Fatalf("the refused agent kept serving: %d refused requests, then %d", before, after)
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if n := spy.count(http.MethodGet, "/v1/models", http.StatusUnauthorized); n == 0 {
			return fmt.Errorf("no authenticated re-probe yet")
		}
		return nil
	})

	spy.setKey("k1") // fixed
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		a, err := agentState(t, b.HTTP, "spied")
		if err != nil {
			return err
		}
		if a.State != "ready" || a.StateReason != "" {
			return fmt.Errorf("not back: %+v", a)
		}
		return nil
	})
	cmdtest.WaitEligible(t, b.HTTP, "spied")
	t.Logf("%d requests until the first 401; all succeeded", sent)
}
