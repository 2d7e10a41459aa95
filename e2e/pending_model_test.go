package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// pendingView is what /v1/fleet says of agents and pending agents.
type pendingView struct {
	Models []struct {
		Model string `json:"model"`
	} `json:"models"`
	Agents []struct {
		ID    string `json:"id"`
		Model string `json:"model"`
	} `json:"agents"`
	Pending []struct {
		ID          string `json:"id"`
		Pool        string `json:"pool"`
		StateReason string `json:"state_reason"`
	} `json:"pending"`
}

func getPendingView(base string) (pendingView, error) {
	var v pendingView
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// get returns the status and body of a GET.
func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	return resp.StatusCode, readAll(resp), nil
}

// TestAgentWithoutModelShowsPending: an agent started without --model, as
// the README writes it, whose engine is still loading its weights, answers
// its probes from the start (/readyz 503 saying why), and is in the fleet
// view at once as pending, saying why, in no model: no model, agent or
// metric label names a placeholder. Once the engine names its model the
// agent serves it, is ready, and is pending no more.
func TestAgentWithoutModelShowsPending(t *testing.T) {
	cfg := simengineConfig(model)
	cfg.LoadTime = 10 * time.Second // long enough for a busy machine to show the pending entry first
	e, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(func() { srv.Close(); _ = e.Close() })
	b := cmdtest.StartBroker(t)
	probes := fmt.Sprintf("http://127.0.0.1:%d", natstest.FreePort(t))
	cmdtest.Start(t, agentcmd.Run, "--nats-url", b.NATS, "--engine", "openai", "--engine-url", srv.URL, "--id", "loading",
		"--heartbeat", liveHeartbeat, "--slow-start", "0", "--log-level", "warn", "--metrics-listen", strings.TrimPrefix(probes, "http://"))

	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		code, body, err := get(probes + "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "engine has not named its model yet") {
			t.Fatalf("agent /readyz while its engine loads: %d %q", code, body)
		}
		if code, _, err := get(probes + "/healthz"); err != nil || code != http.StatusOK {
			return fmt.Errorf("agent /healthz: %d %v", code, err)
		}
		return nil
	})
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		v, err := getPendingView(b.HTTP)
		if err != nil {
			return err
		}
		for _, a := range v.Agents {
			t.Fatalf("agent listed under a model while pending: %+v", a)
		}
		for _, m := range v.Models {
			t.Fatalf("model listed while the only agent is pending: %+v", m)
		}
		for _, p := range v.Pending {
			if p.ID == "loading" && p.Pool == "regular" && strings.Contains(p.StateReason, "engine has not named its model yet") {
				return nil
			}
		}
		return fmt.Errorf("no pending entry for the loading agent yet: %+v", v.Pending)
	})
	if _, metrics, err := get(b.HTTP + "/metrics"); err != nil || strings.Contains(metrics, agentcmd.PendingModel) {
		t.Fatalf("a metric names the placeholder %q (%v):\n%s", agentcmd.PendingModel, err, metrics)
	}
	if e.Loaded() {
		t.Fatal("the engine loaded before the pending entry was seen: the test shows nothing")
	}

	cmdtest.WaitEligible(t, b.HTTP, "loading")
	testwait.Status(t, nil, probes+"/readyz", http.StatusOK)
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		v, err := getPendingView(b.HTTP)
		if err != nil {
			return err
		}
		if len(v.Pending) > 0 {
			return fmt.Errorf("still pending: %+v", v.Pending)
		}
		return nil
	})
}
