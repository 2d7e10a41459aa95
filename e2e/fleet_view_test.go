package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// fleetPools is the per-pool part of GET /v1/fleet.
type fleetPools struct {
	Models []struct {
		Model string `json:"model"`
		Pools []struct {
			Pool           string `json:"pool"`
			Agents         int    `json:"agents"`
			Active         int    `json:"active"`
			EligibleActive int    `json:"eligible_active"`
		} `json:"pools"`
	} `json:"models"`
	Agents []struct {
		ID     string `json:"id"`
		State  string `json:"state"`
		Active int    `json:"active"`
	} `json:"agents"`
}

func getFleetPools(base string) (fleetPools, error) {
	var f fleetPools
	resp, err := http.Get(base + "/v1/fleet")
	if err != nil {
		return f, err
	}
	defer resp.Body.Close()
	return f, json.NewDecoder(resp.Body).Decode(&f)
}

// TestDrainingAgentCountsAndLeaves: an agent told to stop drains with its
// streams still running; its pool's active counts them (in the fleet view
// and on /metrics) while none of it is eligible. Once the agent has
// drained and exited, its last heartbeat takes it out of the fleet view at
// once, instead of it lingering as a stale entry.
func TestDrainingAgentCountsAndLeaves(t *testing.T) {
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 20 * time.Millisecond, Slots: 4})
	a := startAgent(t, b.NATS, "a1", e, 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	var hangUps []func()
	for i := range 2 {
		hangUp, _ := openStream(t, b.HTTP, fmt.Sprintf("a long story %d", i), 5000)
		hangUps = append(hangUps, hangUp)
	}
	a.Cancel() // as SIGTERM: the agent drains what it holds

	testwait.For(t, 20*time.Second, 10*time.Millisecond, func() error {
		f, err := getFleetPools(b.HTTP)
		if err != nil {
			return err
		}
		if len(f.Agents) != 1 || f.Agents[0].State != "draining" || f.Agents[0].Active != 2 {
			return fmt.Errorf("agents %+v, want a1 draining with 2 active", f.Agents)
		}
		for _, m := range f.Models {
			for _, p := range m.Pools {
				if p.Pool == "regular" && (p.Agents != 1 || p.Active != 2 || p.EligibleActive != 0) {
					return fmt.Errorf("regular pool %+v, want 1 agent, active 2, eligible_active 0", p)
				}
			}
		}
		return nil
	})
	metric := `switchyard_pool_active_jobs{model="` + model + `",pool="regular"}`
	if v := scrapeValue(b.HTTP+"/metrics", metric); v != "2" {
		t.Errorf("%s = %q, want 2", metric, v)
	}
	metric = `switchyard_pool_eligible_active_jobs{model="` + model + `",pool="regular"}`
	if v := scrapeValue(b.HTTP+"/metrics", metric); v != "0" {
		t.Errorf("%s = %q, want 0", metric, v)
	}

	for _, h := range hangUps {
		h()
	}
	if err := a.Stop(t); err != nil {
		t.Fatalf("agent returned %v", err)
	}
	// Without its goodbye the entry would stay, stale, for minutes.
	testwait.For(t, 10*time.Second, 10*time.Millisecond, func() error {
		f, err := getFleetPools(b.HTTP)
		if err != nil {
			return err
		}
		if len(f.Agents) != 0 {
			return fmt.Errorf("agents %+v still in the fleet view", f.Agents)
		}
		return nil
	})
}

// TestQueueDepthReadsZero: the queue depth of a pool with agents reads 0
// when its queue is empty, rather than being absent from /metrics.
func TestQueueDepthReadsZero(t *testing.T) {
	b := cmdtest.StartBroker(t)
	startAgent(t, b.NATS, "a1", fastEngine(t, 4), 4)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	metric := `switchyard_queue_depth{model="` + model + `",pool="regular"}`
	if v := scrapeValue(b.HTTP+"/metrics", metric); v != "0" {
		t.Errorf("%s = %q, want 0", metric, v)
	}
}
