package e2e

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// TestAgentWithoutModelShowsWarming: an agent started without --model, as
// the README writes it, whose engine is still loading its weights, is in
// the fleet view at once, warming, saying why; once the engine names its
// model the agent serves it and the placeholder entry is gone.
func TestAgentWithoutModelShowsWarming(t *testing.T) {
	cfg := simengineConfig(model)
	cfg.LoadTime = 10 * time.Second // long enough for a busy machine to show the warming entry first
	e, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(func() { srv.Close(); _ = e.Close() })
	b := cmdtest.StartBroker(t)
	cmdtest.Start(t, agentcmd.Run, "--nats-url", b.NATS, "--engine", "openai", "--engine-url", srv.URL, "--id", "loading",
		"--heartbeat", liveHeartbeat, "--slow-start", "0", "--log-level", "warn")

	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, a := range getFleet(t, b.HTTP).Agents {
			if a.ID == "loading" && a.Model == agentcmd.PendingModel && a.State == "warming" &&
				strings.Contains(a.StateReason, "engine has not named its model yet") {
				return nil
			}
		}
		return fmt.Errorf("no warming entry for the loading agent yet")
	})
	if e.Loaded() {
		t.Fatal("the engine loaded before the warming entry was seen: the test shows nothing")
	}

	cmdtest.WaitEligible(t, b.HTTP, "loading")
	testwait.For(t, 10*time.Second, 20*time.Millisecond, func() error {
		for _, a := range getFleet(t, b.HTTP).Agents {
			if a.Model == agentcmd.PendingModel {
				return fmt.Errorf("placeholder entry still listed: %+v", a)
			}
		}
		return nil
	})
}
