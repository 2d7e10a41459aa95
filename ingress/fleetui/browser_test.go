package fleetui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/switchyard-ai/switchyard/ingress/fleetui"
	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// chromiumPath is Debian's chromium, which .ci/run installs. Without it the
// browser tests skip on a developer's machine and fail in CI.
func chromiumPath(t *testing.T) string {
	t.Helper()
	const p = "/usr/bin/chromium"
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing (CI=true): install it with apt-get install -y chromium", p)
		}
		t.Skipf("%s is missing; apt-get install -y chromium to run the browser tests", p)
	}
	return p
}

// newBrowser starts a headless chromium and returns the context of its tab,
// with the page's console collected for the test's log.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	var mu sync.Mutex
	var exceptions []string
	messages := chromedp.Console(ctx)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() {
				mu.Lock()
				exceptions = append(exceptions, m.String())
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range exceptions {
			t.Errorf("page exception: %s", e)
		}
	})
	return ctx
}

// startBroker runs the real broker command with two demo agents and returns
// its HTTP base URL and NATS URL once it is ready.
func startBroker(t *testing.T) (httpURL, natsURL string) {
	t.Helper()
	b := cmdtest.StartBroker(t, "--demo", "--demo-agents", "regular=2", "--shutdown-grace", "5s")
	return b.HTTP, b.NATS
}

// servePage serves the fleet page as the broker will, and forwards the
// routes it fetches to backend.
func servePage(t *testing.T, backend http.Handler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", fleetui.Handler())
	mux.Handle("GET /ui/", fleetui.Handler())
	mux.Handle("/v1/", backend)
	mux.Handle("/metrics", backend)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

type agentRow struct {
	ID     string `json:"id"`
	State  string `json:"state"`
	Status string `json:"status"`
}

const agentRowsJS = `Array.from(document.querySelectorAll('#agents-body tr[data-agent-id]')).map(e => ({id: e.dataset.agentId, state: e.dataset.state, status: e.dataset.status}))`

func agentRows(ctx context.Context) (map[string]agentRow, error) {
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]agentRow](agentRowsJS))
	if err != nil {
		return nil, err
	}
	out := make(map[string]agentRow, len(rows))
	for _, r := range rows {
		out[r.ID] = r
	}
	return out, nil
}

func wantState(ctx context.Context, ids []string, state string) error {
	rows, err := agentRows(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if r, ok := rows[id]; !ok || r.State != state {
			return fmt.Errorf("agent %s: want %s, page shows %+v (all: %v)", id, state, r, rows)
		}
	}
	return nil
}

// saveScreenshot writes the page to os.TempDir() and, with
// UPDATE_SCREENSHOT=1, to testdata/ for the repository.
func saveScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	p := filepath.Join(os.TempDir(), "switchyard-"+name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot artifact: %s", p)
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		if err := os.WriteFile(filepath.Join("testdata", name), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("updated testdata/%s", name)
	}
}

// sendTraffic posts short chat completions from workers until stop is
// closed or n requests have been sent, so the charts have something to show.
func sendTraffic(base string, workers, n int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	jobs := make(chan struct{})
	go func() {
		defer close(jobs)
		for range n {
			select {
			case jobs <- struct{}{}:
			case <-stop:
				return
			}
		}
	}()
	client := &http.Client{Timeout: 10 * time.Second}
	body := `{"model":"sim-model","max_tokens":12,"messages":[{"role":"user","content":"status of the rollout?"}]}`
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	return &wg
}

// TestFleetPageShowsDrain drives the page against a real broker: it must
// show the demo agents ready, a new agent joining, and that agent draining
// when it is stopped, without a reload.
func TestFleetPageShowsDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker and a browser")
	}
	ctx := newBrowser(t)
	brokerURL, natsURL := startBroker(t)
	target, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	page := servePage(t, httputil.NewSingleHostReverseProxy(target))

	if err := chromedp.Do(ctx, chromedp.Navigate(page+"/")); err != nil {
		t.Fatalf("navigate: %v", err)
	}
	// A marker that a reload would lose.
	if err := chromedp.Do(ctx, chromedp.Evaluate[chromedp.Void](`window.__noReload = 42`)); err != nil {
		t.Fatal(err)
	}
	demo := []string{"demo-regular-1", "demo-regular-2"}
	testwait.For(t, 20*time.Second, 50*time.Millisecond, func() error { return wantState(ctx, demo, "ready") })

	// Its engine is slow to answer, so the traffic below keeps it busy:
	// stopped with jobs in hand it drains for seconds (an idle agent
	// drains at once and leaves the table before a poll could show it).
	agent := cmdtest.Start(t, agentcmd.Run, "--nats-url", natsURL, "--engine", "sim", "--id", "drain-me", "--heartbeat", "100ms", "--sim-ttft", "3s")
	testwait.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		if err := agent.Exited(); err != nil {
			return fmt.Errorf("agent exited early: %v\n%s", err, agent.Err.String())
		}
		return wantState(ctx, []string{"drain-me"}, "ready")
	})

	stopTraffic := make(chan struct{})
	traffic := sendTraffic(brokerURL, 3, 400, stopTraffic)
	defer func() {
		close(stopTraffic)
		traffic.Wait()
	}()
	// The charts are fed by /metrics: requests per second and mean TTFT.
	testwait.For(t, 20*time.Second, 100*time.Millisecond, func() error {
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
			`[document.getElementById('sum-rps').dataset.rps, document.getElementById('sum-ttft').dataset.ttft]`))
		if err != nil {
			return err
		}
		if len(got) != 2 || got[0] == "" || got[0] == "0.000" || got[1] == "" {
			return fmt.Errorf("rps/ttft tiles: %q", got)
		}
		return nil
	})

	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		waitPolls(t, ctx, 15) // a longer chart for the picture in the repository
	}

	agent.Cancel() // SIGTERM: the agent drains
	sawDraining := false
	testwait.For(t, 20*time.Second, 50*time.Millisecond, func() error {
		rows, err := agentRows(ctx)
		if err != nil {
			return err
		}
		r, ok := rows["drain-me"]
		switch {
		case ok && r.State == "draining":
			sawDraining = true
			return nil
		case !ok:
			return errors.New("drain-me left the page before it showed draining")
		}
		return fmt.Errorf("drain-me shows %+v", r)
	})
	if !sawDraining {
		t.Fatal("never saw drain-me draining")
	}
	saveScreenshot(t, ctx, "fleet.png")
	select {
	case <-agent.Done():
		if err := agent.Result(); err != nil {
			t.Errorf("agent: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("drain-me did not exit after draining:\n%s", agent.Err.String())
	}
	marker, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__noReload || 0`))
	if err != nil || marker != 42 {
		t.Fatalf("page was reloaded (marker %d, %v)", marker, err)
	}
	// The demo agents stay ready throughout.
	if err := wantState(ctx, demo, "ready"); err != nil {
		t.Fatal(err)
	}
}

// waitPolls waits until the page has rendered n more fleet views.
func waitPolls(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	updated := func() string {
		s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.dataset.updated || ''`))
		return s
	}
	prev := updated()
	for range n {
		testwait.For(t, 10*time.Second, 50*time.Millisecond, func() error {
			if cur := updated(); cur != prev {
				prev = cur
				return nil
			}
			return errors.New("no new poll")
		})
	}
}

// pdFleet is a fleet mid-rollout from regular to PD, with the fields the
// page shows only when the broker sends them (recent, queue).
func pdFleet(now time.Time) map[string]any {
	ts := func(ago time.Duration) string { return now.Add(-ago).UTC().Format(time.RFC3339Nano) }
	agent := func(id, pool, state string, slots, active int, eff float64, eligible bool, reason string, hbAgo time.Duration) map[string]any {
		a := map[string]any{
			"id": id, "model": "meta-llama/Llama-3.1-8B-Instruct", "pool": pool, "state": state,
			"engine": "vllm", "transport": "http", "slots": slots, "active": active,
			"effective_slots": eff, "eligible": eligible, "ready_since": ts(10 * time.Minute), "last_heartbeat": ts(hbAgo),
		}
		if reason != "" {
			a["reason"] = reason
		}
		return a
	}
	return map[string]any{
		"at": now.UTC().Format(time.RFC3339Nano),
		"models": []any{map[string]any{
			"model": "meta-llama/Llama-3.1-8B-Instruct", "mode": "capacity",
			"weights": map[string]any{"regular": 9, "pd": 6.5},
			"recent":  map[string]any{"window_seconds": 60, "regular": 412, "pd": 268},
			"queue":   map[string]any{"regular": 0, "prefill": 3, "decode": 1},
			"pools": []any{
				map[string]any{"pool": "regular", "agents": 3, "eligible": 2, "slots": 32, "effective_slots": 32, "active": 23, "eligible_active": 23, "free": 9,
					"learned": map[string]any{"agents": 2, "samples": 40, "ttft_seconds": 0.35, "itl_seconds": 0.031}, "slo": map[string]any{"met": 87, "missed": 13}},
				map[string]any{"pool": "prefill", "agents": 1, "eligible": 1, "slots": 16, "effective_slots": 6.5, "active": 3, "eligible_active": 3, "free": 3.5},
				map[string]any{"pool": "decode", "agents": 1, "eligible": 1, "slots": 16, "effective_slots": 16, "active": 12, "eligible_active": 12, "free": 4,
					"slo": map[string]any{"met": 50, "missed": 0}},
			},
		}},
		"agents": []any{
			agent("gpu-node-07-decode", "decode", "ready", 16, 12, 16, true, "", 400*time.Millisecond),
			agent("gpu-node-06-prefill", "prefill", "ready", 16, 3, 6.5, true, "", 200*time.Millisecond),
			agent("gpu-node-01", "regular", "ready", 16, 12, 16, true, "", 300*time.Millisecond),
			agent("gpu-node-02", "regular", "ready", 16, 11, 16, true, "", 900*time.Millisecond),
			agent("gpu-node-03", "regular", "draining", 16, 2, 0, false, "draining", 500*time.Millisecond),
			agent("gpu-node-04", "regular", "ready", 16, 0, 0, false, "stale", 47*time.Second),
		},
	}
}

// TestFleetPageAPIKey checks the 401 path (the page asks for a key and
// sends it as a Bearer token) and the optional recent and queue fields.
func TestFleetPageAPIKey(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	ctx := newBrowser(t)
	var mu sync.Mutex
	var auths []string
	backend := http.NewServeMux()
	backend.HandleFunc("GET /v1/fleet", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":{"message":"missing or bad API key","type":"invalid_request_error"}}`)
			return
		}
		_ = json.NewEncoder(w).Encode(pdFleet(time.Now()))
	})
	page := servePage(t, backend) // /metrics is 404 here: the page copes

	if err := chromedp.Do(ctx, chromedp.Navigate(page+"/")); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("api-key"))); err != nil {
		t.Fatalf("no API key field after a 401: %v", err)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("api-key"), "wrong\n"),
	); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		msg, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('auth-error').textContent`))
		if err != nil || msg == "" {
			return fmt.Errorf("no refusal shown for a wrong key (%v)", err)
		}
		return nil
	})
	if err := chromedp.Do(ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById('api-key').value = ''`),
		chromedp.SendKeys(chromedp.ID("api-key"), "s3cret\n"),
	); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		return wantState(ctx, []string{"gpu-node-01", "gpu-node-02", "gpu-node-06-prefill", "gpu-node-07-decode"}, "ready")
	})
	type probe struct {
		AuthHidden bool              `json:"authHidden"`
		Queue      map[string]string `json:"queue"`
		Recent     string            `json:"recent"`
		Stale      string            `json:"stale"`
		Draining   string            `json:"draining"`
		Pools      []string          `json:"pools"`
		SLO        map[string]string `json:"slo"`
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[probe](`(() => {
		const q = {};
		document.querySelectorAll('[data-queue-pool]').forEach(e => q[e.dataset.queuePool] = e.dataset.depth);
		const row = id => document.querySelector('#agents-body tr[data-agent-id="' + id + '"]');
		const recent = document.querySelector('[data-split="recent"]');
		return {
			authHidden: document.getElementById('auth').hidden,
			queue: q,
			recent: recent ? recent.dataset.regular + '/' + recent.dataset.pd : '',
			stale: row('gpu-node-04').dataset.status,
			draining: row('gpu-node-03').dataset.status,
			pools: Array.from(document.querySelectorAll('.model[data-model] tr[data-pool]')).map(e => e.dataset.pool),
			slo: Object.fromEntries(Array.from(document.querySelectorAll('.model[data-model] tr[data-pool]')).map(e => {
				const c = e.querySelector('[data-slo]');
				return [e.dataset.pool, c ? c.dataset.slo : ''];
			})),
		};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	want := probe{
		AuthHidden: true,
		Queue:      map[string]string{"regular": "0", "prefill": "3", "decode": "1"},
		Recent:     "412/268",
		Stale:      "stale",
		Draining:   "draining",
		Pools:      []string{"regular", "prefill", "decode"},
		SLO:        map[string]string{"regular": "87", "prefill": "", "decode": "100"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("page shows %+v\nwant %+v", got, want)
	}
	mu.Lock()
	sawBearer := false
	for _, a := range auths {
		sawBearer = sawBearer || a == "Bearer s3cret"
	}
	first := auths[0]
	mu.Unlock()
	if first != "" || !sawBearer {
		t.Errorf("Authorization headers %q: want none first, then Bearer s3cret", auths)
	}
	saveScreenshot(t, ctx, "fleet-pd.png")
}

// batchFleet is pdFleet with batch work: two batches in flight and the
// batch work of two pools (the third as a broker without work classes
// shows it: no field).
func batchFleet(now time.Time) map[string]any {
	v := pdFleet(now)
	m := v["models"].([]any)[0].(map[string]any)
	pools := m["pools"].([]any)
	pools[0].(map[string]any)["batch"] = map[string]any{"running": 8, "queued": 120, "slot_share": 0.25}
	pools[2].(map[string]any)["batch"] = map[string]any{"running": 4, "queued": 0, "slot_share": 0.25}
	lines := func(total, queued, running, completed, failed int) map[string]any {
		return map[string]any{"total": total, "queued": queued, "running": running, "completed": completed, "failed": failed}
	}
	v["batches"] = map[string]any{
		"active": 2,
		"lines":  lines(1050, 400, 8, 622, 20),
		"items": []any{
			map[string]any{"id": "batch_eval", "status": "in_progress", "endpoint": "/v1/chat/completions", "driver": "broker-a", "lines": lines(1000, 372, 8, 600, 20)},
			map[string]any{"id": "batch_new", "status": "validating", "endpoint": "/v1/embeddings", "lines": lines(50, 28, 0, 22, 0)},
		},
	}
	return v
}

// TestFleetPageBatches checks the batches table (status, lines queued,
// running, completed, failed, progress) and each pool's batch share, and
// that a fleet view without batch fields shows neither.
func TestFleetPageBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	ctx := newBrowser(t)
	var mu sync.Mutex
	withBatches := false
	backend := http.NewServeMux()
	backend.HandleFunc("GET /v1/fleet", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		v := pdFleet(time.Now())
		if withBatches {
			v = batchFleet(time.Now())
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	})
	page := servePage(t, backend)
	if err := chromedp.Do(ctx, chromedp.Navigate(page+"/")); err != nil {
		t.Fatal(err)
	}
	type probe struct {
		Hidden  bool              `json:"hidden"`
		Active  string            `json:"active"`
		Rows    map[string]string `json:"rows"`
		Share   map[string]string `json:"share"`
		Headers int               `json:"headers"`
	}
	const probeJS = `(() => {
		const rows = {};
		document.querySelectorAll('#batches-body tr[data-batch-id]').forEach(e => {
			rows[e.dataset.batchId] = e.dataset.status + ' ' + e.dataset.lines + ' ' + e.querySelector('[data-progress]').dataset.progress;
		});
		const share = {};
		document.querySelectorAll('.model[data-model] tr[data-pool]').forEach(e => {
			const c = e.querySelector('[data-batch-share]');
			share[e.dataset.pool] = c ? c.dataset.batchShare + '/' + c.dataset.batchRunning : '';
		});
		return {hidden: document.getElementById('batches-wrap').hidden, active: document.getElementById('batches-count').dataset.active || '',
			rows, share, headers: document.querySelectorAll('.model[data-model] .pools th').length};
	})()`
	read := func() (probe, error) { return chromedp.Run(ctx, chromedp.Evaluate[probe](probeJS)) }
	testwait.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		return wantState(ctx, []string{"gpu-node-01"}, "ready")
	})
	got, err := read()
	if err != nil {
		t.Fatal(err)
	}
	if !got.Hidden || len(got.Rows) != 0 || got.Headers != 9 {
		t.Fatalf("without batch fields the page shows %+v; want the batches hidden and 9 pool columns", got)
	}

	mu.Lock()
	withBatches = true
	mu.Unlock()
	want := probe{
		Hidden:  false,
		Active:  "2",
		Rows:    map[string]string{"batch_eval": "in_progress 372/8/600/20/1000 0.620", "batch_new": "validating 28/0/22/0/50 0.440"},
		Share:   map[string]string{"regular": "0.250/8", "prefill": "", "decode": "0.250/4"},
		Headers: 10,
	}
	testwait.For(t, 10*time.Second, 50*time.Millisecond, func() error {
		got, err := read()
		if err != nil {
			return err
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("page shows %+v\nwant %+v", got, want)
		}
		return nil
	})
	saveScreenshot(t, ctx, "fleet-batches.png")
}
