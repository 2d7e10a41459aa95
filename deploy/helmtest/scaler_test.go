package helmtest

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/brokercmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

var (
	// scalerTerm is a term of the scaler's query in the form the chart's
	// default has: an aggregation of one selector or vector(0).
	scalerTerm = regexp.MustCompile(`^(sum|max)\((switchyard_[a-z_]+)\{([^}]*)\} or vector\(0\)\)$`)
	labelMatch = regexp.MustCompile(`^([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"$`)
)

// evalScalerQuery computes what Prometheus answers to query over the
// brokers' scrapes, each sample carrying the target labels Prometheus
// adds at scrape time. It knows the chart's form of the query only: a sum
// of terms sum(...) or max(...) of one selector with label equalities,
// each "or vector(0)".
func evalScalerQuery(t *testing.T, query string, scrapes []map[string]*dto.MetricFamily, target map[string]string) float64 {
	t.Helper()
	total := 0.0
	for _, term := range strings.Split(strings.Join(strings.Fields(query), " "), " + ") {
		m := scalerTerm.FindStringSubmatch(term)
		if m == nil {
			t.Fatalf("the test evaluates sums of sum(...) and max(...) of one selector, or vector(0); the query has %q", term)
		}
		want := map[string]string{}
		for _, l := range strings.Split(m[3], ",") {
			lm := labelMatch.FindStringSubmatch(strings.TrimSpace(l))
			if lm == nil {
				t.Fatalf("label matcher %q: the test evaluates equalities only", l)
			}
			v, err := strconv.Unquote(`"` + lm[2] + `"`)
			if err != nil {
				t.Fatal(err)
			}
			want[lm[1]] = v
		}
		agg := 0.0 // vector(0)
		for _, families := range scrapes {
			for _, s := range families[m[2]].GetMetric() {
				labels := map[string]string{}
				for k, v := range target {
					labels[k] = v
				}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				match := true
				for k, v := range want {
					if labels[k] != v {
						match = false
					}
				}
				if !match {
					continue
				}
				v := s.GetGauge().GetValue()
				if m[1] == "sum" {
					agg += v
				} else {
					agg = math.Max(agg, v)
				}
			}
		}
		total += agg
	}
	return total
}

func scrape(t *testing.T, url string) (map[string]*dto.MetricFamily, error) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// TestScalerReadsTheWork computes what a pool's KEDA scaler reads (the
// chart's query over the metrics of a broker, as Prometheus would scrape
// it in the release's namespace) with a broker and an agent of two slots
// as the chart renders them, the simulator as their engine: 0 at rest;
// with five long requests, two running and three queued, 5 (of which a
// scaler on the jobs stream's backlog would see 3); 0 again once they
// end.
func TestScalerReadsTheWork(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a broker and an agent under load")
	}
	chart := chartDir(t)
	objs := render(t, chart, []string{filepath.Join(chart, "examples", "vllm-regular.yaml")})
	trigger := scalerOf(objs, "llama").Triggers[0].Metadata
	query := trigger["query"]
	threshold, err := strconv.Atoi(trigger["threshold"])
	if err != nil {
		t.Fatal(err)
	}
	s := natstest.RunJetStream(t)
	httpPort, metricsPort := natstest.FreePort(t), natstest.FreePort(t)
	runContainer(t, "broker", brokerIn(objs), brokercmd.Run, s.ClientURL(), nil, func(a []string) []string {
		a = setFlag(a, "http", fmt.Sprintf("127.0.0.1:%d", httpPort))
		a = setFlag(a, "grpc", "")
		a = setFlag(a, "replicas", "1")
		a = setFlag(a, "heartbeat-interval", "500ms")
		a = setFlag(a, "slow-start", "0")
		return setFlag(a, "shutdown-delay", "0s")
	})
	a := agentIn(objs, "regular")
	model, _ := cmdtest.FlagValue(a.Args, "model")
	runContainer(t, "agent", a, agentcmd.Run, s.ClientURL(), nil, func(args []string) []string {
		args = setFlag(args, "metrics-listen", fmt.Sprintf("127.0.0.1:%d", metricsPort))
		args = setFlag(args, "engine", "sim")
		args = setFlag(args, "slots", "2")
		args = setFlag(args, "slow-start", "0")
		args = setFlag(args, "heartbeat", "500ms")
		args = setFlag(args, "sim-ttft", "1ms")
		return setFlag(args, "sim-itl", "200ms")
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	testwait.Status(t, nil, base+"/readyz", http.StatusOK)
	testwait.Status(t, nil, fmt.Sprintf("http://127.0.0.1:%d/readyz", metricsPort), http.StatusOK)

	target := map[string]string{"namespace": defaults.namespace}
	reads := func(want float64, fleet func(map[string]*dto.MetricFamily) error) {
		t.Helper()
		testwait.For(t, 60*time.Second, 100*time.Millisecond, func() error {
			fams, err := scrape(t, base+"/metrics")
			if err != nil {
				return err
			}
			if fleet != nil {
				if err := fleet(fams); err != nil {
					return err
				}
			}
			if got := evalScalerQuery(t, query, []map[string]*dto.MetricFamily{fams}, target); got != want {
				return fmt.Errorf("the scaler reads %v, want %v", got, want)
			}
			return nil
		})
		t.Logf("the scaler reads %v: %v replicas at threshold %d", want, math.Ceil(want/float64(threshold)), threshold)
	}

	// At rest, once the broker counts the agent's slots.
	reads(0, func(fams map[string]*dto.MetricFamily) error {
		for _, m := range fams["switchyard_pool_slots"].GetMetric() {
			if m.GetGauge().GetValue() == 2 {
				return nil
			}
		}
		return fmt.Errorf("the broker does not count the agent's two slots yet")
	})

	// Five requests of 100 tokens, 200 ms apart: two run, three queue.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{}, 5)
	for range 5 {
		go func() {
			defer func() { done <- struct{}{} }()
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":100,"stream":true}`, model)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	// Running work counts: a backlog alone (what the jobs stream's
	// consumer shows) would read 3.
	reads(5, func(fams map[string]*dto.MetricFamily) error {
		for _, m := range fams["switchyard_pool_active_jobs"].GetMetric() {
			if m.GetGauge().GetValue() == 2 {
				return nil
			}
		}
		return fmt.Errorf("the agent's two slots are not both busy yet")
	})

	// The clients leave: their jobs end, running and queued.
	cancel()
	for range 5 {
		<-done
	}
	reads(0, nil)
}

// TestScalerWakesFromZero: a pool at zero replicas has no agent, so a
// request for its model queues nothing; it waits in the broker under
// broker.capacityWait, which the chart passes with the pools' models, and
// the scaler reads it: the query exceeds the activation threshold (0)
// while requests wait and falls back to 0 when their clients leave.
func TestScalerWakesFromZero(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a broker")
	}
	chart := chartDir(t)
	objs := render(t, chart, []string{filepath.Join(chart, "examples", "vllm-regular.yaml")},
		"pools[0].keda.minReplicas=0", "broker.capacityWait=2m")
	trigger := scalerOf(objs, "llama").Triggers[0].Metadata
	if trigger["activationThreshold"] != "0" {
		t.Fatalf("activationThreshold %q, want 0", trigger["activationThreshold"])
	}
	b := brokerIn(objs)
	model, ok := cmdtest.FlagValue(b.Args, "models")
	if !ok || model == "" {
		t.Fatalf("the broker is not told the pools' models: %q", b.Args)
	}
	if wait, _ := cmdtest.FlagValue(b.Args, "capacity-wait"); wait != "2m" {
		t.Fatalf("--capacity-wait %q, want 2m", wait)
	}
	s := natstest.RunJetStream(t)
	httpPort := natstest.FreePort(t)
	runContainer(t, "broker", b, brokercmd.Run, s.ClientURL(), nil, func(a []string) []string {
		a = setFlag(a, "http", fmt.Sprintf("127.0.0.1:%d", httpPort))
		a = setFlag(a, "grpc", "")
		a = setFlag(a, "metrics-listen", "")
		a = setFlag(a, "replicas", "1")
		a = setFlag(a, "heartbeat-interval", "500ms")
		return setFlag(a, "shutdown-delay", "0s")
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	testwait.Status(t, nil, base+"/readyz", http.StatusOK)
	target := map[string]string{"namespace": defaults.namespace}
	reads := func(want float64) {
		t.Helper()
		testwait.For(t, 60*time.Second, 100*time.Millisecond, func() error {
			fams, err := scrape(t, base+"/metrics")
			if err != nil {
				return err
			}
			if got := evalScalerQuery(t, trigger["query"], []map[string]*dto.MetricFamily{fams}, target); got != want {
				return fmt.Errorf("the scaler reads %v, want %v", got, want)
			}
			return nil
		})
	}
	reads(0)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 2)
	for range 2 {
		go func() {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`, model)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				done <- 0
				return
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
	}
	// Two requests wait for the pool's first agent: the scaler wakes it.
	reads(2)
	select {
	case code := <-done:
		t.Fatalf("a request for a pool at zero ended (%d) instead of waiting for capacity", code)
	default:
	}
	cancel()
	for range 2 {
		<-done
	}
	reads(0)
}
