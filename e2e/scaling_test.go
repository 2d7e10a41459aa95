package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/simengine"
)

// scrape reads a broker's /metrics.
func scrape(base string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// series is the value of family's series with the model and pool labels,
// and whether it is there.
func series(families map[string]*dto.MetricFamily, family, modelID, pool string) (float64, bool) {
	for _, m := range families[family].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model"] == modelID && labels["pool"] == pool {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// scalerReading is what a pool's autoscaler reads from the brokers' metrics
// with the query of docs/operations.md:
//
//	max(switchyard_pool_demand_jobs{model, pool})
//	  + sum(switchyard_capacity_waiting_requests{model, pool})
//
// the work the pool has (the same on every broker) plus the requests each
// broker holds waiting for an agent. It is an error for a broker to show
// neither series: the scaler would read nothing.
type scalerReading struct {
	value   float64
	waiting []float64 // per broker
	demand  []float64
}

func readScaler(brokers []string, modelID, pool string) (scalerReading, error) {
	var r scalerReading
	maxDemand := 0.0
	for _, base := range brokers {
		fams, err := scrape(base)
		if err != nil {
			return r, err
		}
		d, okD := series(fams, "switchyard_pool_demand_jobs", modelID, pool)
		w, okW := series(fams, "switchyard_capacity_waiting_requests", modelID, pool)
		if !okD || !okW {
			return r, fmt.Errorf("broker %s: no switchyard_pool_demand_jobs or switchyard_capacity_waiting_requests series for %s/%s", base, modelID, pool)
		}
		maxDemand = max(maxDemand, d)
		r.value += w
		r.waiting = append(r.waiting, w)
		r.demand = append(r.demand, d)
	}
	r.value += maxDemand
	return r, nil
}

// TestScalerSignal computes what a pool's autoscaler reads, through the
// /metrics of two real brokers, at rest, while requests wait for a pool
// scaled to zero (--capacity-wait), while its one agent works through
// them, and at rest again; and that the series of a model stay, at 0,
// after its last agent left.
func TestScalerSignal(t *testing.T) {
	args := []string{"--capacity-wait", "60s", "--models", model, "--request-timeout", "2m"}
	b1 := cmdtest.StartBroker(t, args...)
	b2 := cmdtest.StartBroker(t, append(args, "--nats-url", b1.NATS)...)
	brokers := []string{b1.HTTP, b2.HTTP}
	read := func() scalerReading {
		t.Helper()
		r, err := readScaler(brokers, model, "regular")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := read(); r.value != 0 {
		t.Fatalf("at rest with no agent the scaler reads %+v, want 0", r)
	}

	// Three requests for a pool with no agent: they wait, in no queue,
	// two on one broker and one on the other.
	const prompt = "holding the only slot 154"
	var wg sync.WaitGroup
	results := make([]streamResult, 3)
	errs := make([]error, 3)
	for i, base := range []string{b1.HTTP, b1.HTTP, b2.HTTP} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = rawStream(context.Background(), base, prompt, 20)
		}()
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if r := read(); r.value != 3 || r.waiting[0] != 2 || r.waiting[1] != 1 {
			return fmt.Errorf("scaler reads %+v, want 3: 2 waiting on one broker, 1 on the other", r)
		}
		return nil
	})

	// One agent of one slot starts (the scaler's answer): one request
	// runs, two queue, and the scaler reads the same work.
	e := startEngine(t, simengine.Config{Model: model, TTFT: time.Millisecond, ITL: 150 * time.Millisecond, Slots: 1})
	agent := startAgent(t, b1.NATS, "a1", e, 1)
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		// The queue is read every second and the agents' jobs at every
		// heartbeat: a job taken between the two may count twice for a
		// moment, so the test waits for the reading, not every sample.
		r := read()
		if r.value != 3 || r.waiting[0]+r.waiting[1] != 0 || r.demand[0] != 3 || r.demand[1] != 3 {
			return fmt.Errorf("scaler reads %+v, want 3 from the pool's demand on both brokers and none waiting", r)
		}
		return nil
	})
	wg.Wait()
	for i, r := range results {
		if errs[i] != nil || r.status != http.StatusOK || !r.done {
			t.Fatalf("request %d: %+v %v", i, r, errs[i])
		}
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		if r := read(); r.value != 0 {
			return fmt.Errorf("at rest the scaler reads %+v, want 0", r)
		}
		return nil
	})

	// A broker that knows the model only from its agent keeps its series,
	// at 0, once the agent is gone.
	b3 := cmdtest.StartBroker(t, "--nats-url", b1.NATS)
	cmdtest.WaitEligible(t, b3.HTTP, "a1")
	if err := agent.Stop(t); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, 20*time.Millisecond, func() error {
		fams, err := scrape(b3.HTTP)
		if err != nil {
			return err
		}
		if n, ok := series(fams, "switchyard_agents", model, "regular"); ok && n > 0 {
			return fmt.Errorf("the agent is still listed")
		}
		for _, name := range []string{"switchyard_queue_depth", "switchyard_pool_demand_jobs", "switchyard_capacity_waiting_requests"} {
			if v, ok := series(fams, name, model, "regular"); !ok || v != 0 {
				return fmt.Errorf("%s{model=%q,pool=\"regular\"} = %v (present %v), want 0", name, model, v, ok)
			}
		}
		return nil
	})
}
