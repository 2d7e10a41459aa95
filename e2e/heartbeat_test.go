package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/agent/engine/openai"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/wire"
)

func watchHeartbeats(t testing.TB, url string) *heartbeatPeaks {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p := &heartbeatPeaks{peak: map[string]int{}, slots: map[string]int{}}
	_, err = nc.Subscribe("sy.hb.>", func(m *nats.Msg) {
		hb, err := wire.UnmarshalHeartbeat(m.Data)
		if err != nil {
			t.Errorf("bad heartbeat on %s: %v", m.Subject, err)
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.slots[hb.GetAgentId()] = int(hb.GetSlots())
		p.peak[hb.GetAgentId()] = max(p.peak[hb.GetAgentId()], int(hb.GetActive()))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHeartbeatFields reads a heartbeat off NATS as `nats sub 'sy.hb.>'`
// would and checks the documented fields.
func TestHeartbeatFields(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := fastEngine(t, 8)
	startAgent(t, b.NATS, "gpu-1", e, 6)
	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("sy.hb.>")
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	var subject string
	testwait.For(t, 20*time.Second, time.Millisecond, func() error {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			return err
		}
		subject = m.Subject
		fields = nil
		if err := json.Unmarshal(m.Data, &fields); err != nil {
			return err
		}
		if fields["state"] != "ready" {
			return fmt.Errorf("state %v", fields["state"])
		}
		return nil
	})
	if subject != "sy.hb.sim-model.regular.gpu-1" {
		t.Fatalf("subject %q", subject)
	}
	for k, want := range map[string]any{
		"agent_id": "gpu-1", "model": model, "pool": "regular", "engine": "openai", "transport": "http",
		"slots": 6.0, "active": 0.0, "interval": liveHeartbeatJSON,
	} {
		if fields[k] != want {
			t.Errorf("%s = %v (%T), want %v", k, fields[k], fields[k], want)
		}
	}
	for _, k := range []string{"ready_since", "seq", "version", "sent_at", "engine_running", "engine_waiting", "kv_cache_usage"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("field %s missing in %v", k, fields)
		}
	}
}

// TestSilentAgentLeavesTable: an agent that stops heartbeating (its NATS
// connection dies, as when the process is killed) stops being eligible
// after three intervals, and its model then answers 503.
func TestSilentAgentLeavesTable(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := fastEngine(t, 4)
	nc, err := nats.Connect(b.NATS)
	if err != nil {
		t.Fatal(err)
	}
	oa, err := openai.New(e.URL, 4)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(nc, oa, agent.Config{ID: "ghost", Model: model, Slots: 4, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	cmdtest.WaitEligible(t, b.HTTP, "ghost")
	nc.Close() // silence: no draining heartbeat
	// The silence begins at the ghost's last heartbeat as the broker heard
	// it, not when the test closed the connection: a heartbeat may have
	// come up to one interval before.
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, ag := range getFleet(t, b.HTTP).Agents {
			if ag.ID == "ghost" && ag.Eligible {
				return fmt.Errorf("ghost still eligible")
			}
		}
		return nil
	})
	seen := time.Now()
	f := getFleet(t, b.HTTP)
	if len(f.Agents) != 1 || f.Agents[0].Reason != "stale" {
		t.Fatalf("fleet %+v: want the ghost listed as stale", f.Agents)
	}
	gone := seen.Sub(f.Agents[0].LastHeartbeat)
	if gone < 300*time.Millisecond {
		t.Fatalf("agent left %s after its last heartbeat, before three 100ms intervals", gone)
	}
	status, body := post(t, b.HTTP+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "no_capacity") {
		t.Fatalf("status %d body %s", status, body)
	}
	cancel()
	<-done
}

// TestDrain: a draining agent finishes its stream and gets no new job.
func TestDrain(t *testing.T) {
	b := cmdtest.StartBroker(t)
	slow := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 15 * time.Millisecond, Slots: 4})
	other := fastEngine(t, 4)
	drainer := startAgent(t, b.NATS, "drainer", slow, 4)
	cmdtest.WaitEligible(t, b.HTTP, "drainer")

	// A long stream lands on the only agent, then the agent drains.
	const prompt = "a long answer while the node drains"
	var long streamResult
	var longErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		long, longErr = rawStream(context.Background(), b.HTTP, prompt, 40)
	}()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if slow.current.Load() == 0 {
			return fmt.Errorf("stream not started")
		}
		return nil
	})
	startAgent(t, b.NATS, "stayer", other, 4)
	cmdtest.WaitEligible(t, b.HTTP, "stayer")
	stopped := make(chan error, 1)
	go func() { stopped <- drainer.Stop(t) }()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, a := range getFleet(t, b.HTTP).Agents {
			if a.ID == "drainer" && a.State == "draining" {
				return nil
			}
		}
		return fmt.Errorf("drainer not draining yet")
	})
	served := slow.served.Load()
	for i := range 10 {
		r, err := rawStream(context.Background(), b.HTTP, fmt.Sprintf("during drain %d", i), 4)
		if err != nil || r.status != http.StatusOK || !r.done {
			t.Fatalf("request during drain: %+v %v", r, err)
		}
		if r.agent != "stayer" {
			t.Fatalf("request during drain went to %q", r.agent)
		}
	}
	wg.Wait()
	want := expect(t, simengine.APIChat, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":40}`, prompt))
	if longErr != nil || !long.done || long.text != want.Text || long.agent != "drainer" {
		t.Fatalf("in-flight stream on a draining agent: %+v %v; want %q", long, longErr, want.Text)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("drained agent returned %v", err)
	}
	if got := slow.served.Load(); got != served {
		t.Fatalf("draining agent's engine got %d new requests", got-served)
	}
}

func post(t testing.TB, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, readAll(resp)
}

// readAll returns the body read so far; a broken stream ends it early.
func readAll(resp *http.Response) string {
	data, _ := io.ReadAll(resp.Body)
	return string(data)
}
