package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// TestSLOProbe: with every cheap request with targets allowed to probe
// and figures stale after a second, a route the predictions avoid is sent
// probes, at most one per 100ms, and the broker counts them in /metrics
// and /v1/fleet.
func TestSLOProbe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs timed engine steps")
	}
	b := cmdtest.StartBroker(t, "--dispatch-mode", "slo", "--slo-probe-share", "1", "--slo-probe-age", "1s")
	learnedPDFleet(t, b)
	ctx := context.Background()

	// Short prompts with targets, one after another, until one was a
	// probe.
	i := 0
	start := time.Now()
	testwait.For(t, 60*time.Second, 0, func() error {
		i++
		if _, err := sloStream(ctx, b.HTTP, sloPrompt("probe", i, 100), 4, 100*time.Millisecond, nil); err != nil {
			return err
		}
		if n := probesMetric(sloGet(t, b.HTTP+"/metrics")); n == 0 {
			return fmt.Errorf("no probe after %d requests", i)
		}
		return nil
	})
	elapsed := time.Since(start)
	t.Logf("a probe after %d short requests with targets in %v", i, elapsed)

	var f struct {
		Models []struct {
			Pools []struct {
				Pool        string `json:"pool"`
				Predictions *struct {
					Probes uint64 `json:"probes"`
				} `json:"predictions"`
			} `json:"pools"`
		} `json:"models"`
	}
	if err := json.Unmarshal([]byte(sloGet(t, b.HTTP+"/v1/fleet")), &f); err != nil || len(f.Models) != 1 {
		t.Fatalf("fleet view: %v, %d models", err, len(f.Models))
	}
	var probes uint64
	for _, p := range f.Models[0].Pools {
		if p.Predictions != nil && p.Pool != "decode" { // a PD probe shows on both its pools
			probes += p.Predictions.Probes
		}
	}
	if m := probesMetric(sloGet(t, b.HTTP+"/metrics")); m != float64(probes) {
		t.Errorf("switchyard_slo_probes_total sums to %v, /v1/fleet to %d", m, probes)
	}
	if probes == 0 || probes > uint64(i) || probes > 1+uint64(elapsed/(100*time.Millisecond)) {
		t.Errorf("/v1/fleet counts %d probes of %d requests in %v, want at least one, at most one per 100ms", probes, i, elapsed)
	}
}

// probesMetric sums switchyard_slo_probes_total over its series in the
// text exposition m.
func probesMetric(m string) float64 {
	var sum float64
	for _, line := range strings.Split(m, "\n") {
		if !strings.HasPrefix(line, "switchyard_slo_probes_total{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}
