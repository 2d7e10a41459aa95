package simengine

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// testBatch is a batch model whose step costs are easy to add up.
func testBatch() BatchModel {
	return BatchModel{
		Enabled:             true,
		MaxBatchedTokens:    8,
		StepTime:            10 * time.Millisecond,
		StepPerSeq:          time.Millisecond,
		StepPerPrefillToken: 100 * time.Microsecond,
		KVTransferPerToken:  50 * time.Microsecond,
	}
}

// stepper runs a batch engine's steps one at a time when the test says,
// on virtual time: a step does not wait for its duration.
type stepper struct {
	e    *Engine
	gate chan struct{}
	recs chan stepRecord
}

func newStepper(e *Engine) *stepper {
	s := &stepper{e: e, gate: make(chan struct{}), recs: make(chan stepRecord, 1)}
	e.batch.virtual = true
	e.batch.gate = func() { <-s.gate }
	e.batch.record = func(r stepRecord) { s.recs <- r }
	return s
}

// step lets the next step run and returns it.
func (s *stepper) step(t *testing.T) stepRecord {
	t.Helper()
	select {
	case s.gate <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("no step is waiting to run")
	}
	return <-s.recs
}

// waitBatch waits until n sequences are in the batch.
func waitBatch(t *testing.T, e *Engine, n int) {
	t.Helper()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if got := e.batch.size(); got != n {
			return errors.New("batch has " + itoa(got) + " sequences, want " + itoa(n))
		}
		return nil
	})
}

// streamed is a request run through Engine.Stream in a goroutine.
type streamed struct {
	done    chan struct{}
	emitted atomic.Int64
	chunks  [][]byte
	err     error
}

func goStream(ctx context.Context, e *Engine, api API, body string) *streamed {
	s := &streamed{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = e.Stream(ctx, api, []byte(body), func(c []byte) error {
			s.chunks = append(s.chunks, bytes.Clone(c))
			s.emitted.Add(1)
			return nil
		})
	}()
	return s
}

// transcript waits for the request and decodes its chunks.
func (s *streamed) transcript(t *testing.T, api API) *transcript {
	t.Helper()
	<-s.done
	if s.err != nil {
		t.Fatalf("Stream: %v", s.err)
	}
	tr := &transcript{}
	for _, c := range s.chunks {
		tr.add(t, api, c)
	}
	return tr
}

// outputTimes returns the virtual times at which sequence id got its
// outputs.
func outputTimes(recs []stepRecord, id uint64) []time.Duration {
	var at []time.Duration
	for _, r := range recs {
		if slices.Contains(r.outputs, id) {
			at = append(at, r.end)
		}
	}
	return at
}

func gaps(at []time.Duration) []time.Duration {
	var d []time.Duration
	for i := 1; i < len(at); i++ {
		d = append(d, at[i]-at[i-1])
	}
	return d
}

// decodeOnly is a completion body whose output is exactly n tokens long.
func decodeOnly(t *testing.T, prompt string, n int) string {
	t.Helper()
	body := completionJSON(prompt, `"max_tokens":`+itoa(n))
	if x := mustExpect(t, APICompletion, body); x.CompletionTokens != n || x.FinishReason != finishLength {
		t.Fatalf("%s gives %d tokens (%s), want %d: choose another prompt", body, x.CompletionTokens, x.FinishReason, n)
	}
	return body
}

// A regular engine prefills a long prompt beside its decodes, chunk by
// chunk, and the decodes' inter-token latency grows by the prefill's
// share of each step.
func TestBatchITLGrowsWithConcurrentPrefill(t *testing.T) {
	cfg := testConfig()
	cfg.Batch = testBatch()
	m := cfg.Batch
	e := newTestEngine(t, cfg)
	st := newStepper(e)

	const outputs = 12
	aBody := decodeOnly(t, promptWords("a", 2), outputs)
	a := goStream(t.Context(), e, APICompletion, aBody)
	waitBatch(t, e, 1)
	var recs []stepRecord
	for range 3 { // a's prefill, then two decodes alone
		recs = append(recs, st.step(t))
	}
	bBody := completionJSON(promptWords("b", 20), `"max_tokens":1`)
	b := goStream(t.Context(), e, APICompletion, bBody)
	waitBatch(t, e, 2)
	for range outputs - 3 {
		recs = append(recs, st.step(t))
	}

	type shape struct{ running, prefill int }
	want := []shape{
		{0, 2},         // a's prompt
		{1, 0}, {1, 0}, // a decodes alone
		{1, 8}, {1, 8}, {1, 4}, // b's 20 prompt tokens in chunks of 8 beside a
		{1, 0}, {1, 0}, {1, 0}, {1, 0}, // b is done
		{1, 0}, {1, 0},
	}
	for i, r := range recs {
		if got := (shape{r.running, r.prefill}); got != want[i] {
			t.Fatalf("step %d: %d decoding, %d prefilled, want %+v", r.n, r.running, r.prefill, want[i])
		}
		if r.dur != m.StepTime+time.Duration(r.running)*m.StepPerSeq+time.Duration(r.prefill)*m.StepPerPrefillToken {
			t.Fatalf("step %d lasts %v, not the model's formula", r.n, r.dur)
		}
	}

	itl := gaps(outputTimes(recs, 1))
	alone := m.StepTime + m.StepPerSeq
	wantITL := []time.Duration{
		alone, alone,
		alone + 8*m.StepPerPrefillToken, alone + 8*m.StepPerPrefillToken, alone + 4*m.StepPerPrefillToken,
		alone, alone, alone, alone, alone, alone,
	}
	if !slices.Equal(itl, wantITL) {
		t.Fatalf("a's inter-token latencies %v, want %v", itl, wantITL)
	}
	// b's first token comes once its last chunk is prefilled.
	if at := outputTimes(recs, 2); len(at) != 1 || at[0]-recs[2].end != recs[3].dur+recs[4].dur+recs[5].dur {
		t.Fatalf("b's outputs at %v", at)
	}

	if tr := a.transcript(t, APICompletion); tr.text() != mustExpect(t, APICompletion, aBody).Text {
		t.Fatalf("a got %q", tr.text())
	}
	if tr := b.transcript(t, APICompletion); tr.text() != mustExpect(t, APICompletion, bBody).Text {
		t.Fatalf("b got %q", tr.text())
	}
}

// A decode engine never prefills: a long prompt's decode beside another
// costs its step only StepPerSeq, and each decode joins the batch once its
// KV has been transferred, KVTransferPerToken per prompt token.
func TestBatchDecodeEngineDoesNotPrefill(t *testing.T) {
	_, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	dcfg := pdConfig(RoleDecode, PDVLLM)
	dcfg.Batch = testBatch()
	m := dcfg.Batch
	d, _ := pdEngine(t, dcfg)
	st := newStepper(d)
	var (
		mu        sync.Mutex
		transfers []time.Duration
	)
	d.batch.sleep = func(_ context.Context, dur time.Duration) error {
		mu.Lock()
		transfers = append(transfers, dur)
		mu.Unlock()
		return nil
	}

	const outputs = 10
	aPrompt, bPrompt := promptWords("a", 2), promptWords("b", 200)
	aBody := decodeOnly(t, aPrompt, outputs)
	aKV := vllmPrefill(t, psrv.URL, APICompletion, aPrompt)
	bKV := vllmPrefill(t, psrv.URL, APICompletion, bPrompt)
	a := goStream(t.Context(), d, APICompletion, completionJSON(aPrompt, `"max_tokens":`+itoa(outputs)+`,"kv_transfer_params":`+string(aKV)))
	waitBatch(t, d, 1)
	var recs []stepRecord
	for range 3 {
		recs = append(recs, st.step(t))
	}
	bBody := completionJSON(bPrompt, `"max_tokens":3`)
	if x := mustExpect(t, APICompletion, bBody); x.CompletionTokens != 3 {
		t.Fatalf("b gives %d tokens", x.CompletionTokens)
	}
	b := goStream(t.Context(), d, APICompletion, completionJSON(bPrompt, `"max_tokens":3,"kv_transfer_params":`+string(bKV)))
	waitBatch(t, d, 2)
	for range outputs - 3 {
		recs = append(recs, st.step(t))
	}

	for _, r := range recs {
		if r.prefill != 0 {
			t.Fatalf("step %d prefilled %d tokens on a decode engine", r.n, r.prefill)
		}
	}
	itl := gaps(outputTimes(recs, 1))
	alone, beside := m.StepTime+m.StepPerSeq, m.StepTime+2*m.StepPerSeq
	wantITL := []time.Duration{alone, alone, beside, beside, beside, alone, alone, alone, alone}
	if !slices.Equal(itl, wantITL) {
		t.Fatalf("a's inter-token latencies %v, want %v", itl, wantITL)
	}
	if tr := a.transcript(t, APICompletion); tr.text() != mustExpect(t, APICompletion, aBody).Text {
		t.Fatalf("a got %q", tr.text())
	}
	if tr := b.transcript(t, APICompletion); tr.text() != mustExpect(t, APICompletion, bBody).Text {
		t.Fatalf("b got %q", tr.text())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []time.Duration{2 * m.KVTransferPerToken, 200 * m.KVTransferPerToken}; !slices.Equal(transfers, want) {
		t.Fatalf("KV transfers %v, want %v", transfers, want)
	}
}

// recorder collects every step of a batch engine on virtual time.
type recorder struct {
	mu   sync.Mutex
	recs []stepRecord
}

func record(e *Engine) *recorder {
	r := &recorder{}
	e.batch.virtual = true
	e.batch.record = func(s stepRecord) {
		r.mu.Lock()
		r.recs = append(r.recs, s)
		r.mu.Unlock()
	}
	return r
}

// take waits for the engine to go idle and returns the steps since the
// last take.
func (r *recorder) take(t *testing.T, e *Engine) []stepRecord {
	t.Helper()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		e.batch.mu.Lock()
		defer e.batch.mu.Unlock()
		if e.batch.active {
			return errors.New("steps still running")
		}
		return nil
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	recs := r.recs
	r.recs = nil
	return recs
}

func prefilled(recs []stepRecord) int {
	n := 0
	for _, r := range recs {
		n += r.prefill
	}
	return n
}

// Prompt tokens found in the prefix cache are not prefilled.
func TestBatchCachedTokensNotPrefilled(t *testing.T) {
	cfg := cacheConfig(64, 4)
	cfg.Batch = testBatch()
	e := newTestEngine(t, cfg)
	rec := record(e)
	body := completionJSON(promptWords("p", 20), `"max_tokens":2`)

	mustStream(t, e, APICompletion, body)
	if recs := rec.take(t, e); prefilled(recs) != 20 || len(recs) != 4 { // chunks of 8, 8, 4, then a decode
		t.Fatalf("first request: %d steps prefilling %d tokens, want 4 and 20", len(recs), prefilled(recs))
	}
	mustStream(t, e, APICompletion, body)
	// Four blocks of 4 hit; the last prompt token is always computed.
	if recs := rec.take(t, e); prefilled(recs) != 4 || len(recs) != 2 {
		t.Fatalf("second request: %d steps prefilling %d tokens, want 2 and 4", len(recs), prefilled(recs))
	}
	if q, h, _ := e.PrefixCache(); q != 40 || h != 16 {
		t.Fatalf("prefix cache counted %d queries, %d hits", q, h)
	}
}

// The batch model changes timing only: every request gets what the
// constant model gives it, alone or many at once, over HTTP and Stream.
func TestBatchSameTextAsConstantModel(t *testing.T) {
	constant := newTestEngine(t, testConfig())
	cfg := testConfig()
	cfg.Batch = testBatch()
	cfg.Batch.MaxBatchedTokens = 5
	batch := newTestEngine(t, cfg)
	record(batch)
	csrv, bsrv := newTestServer(t, constant), newTestServer(t, batch)

	var bodies []struct {
		api  API
		body string
	}
	for i, extra := range []string{
		`"max_tokens":40`,
		`"max_tokens":17,"stream":true`,
		`"max_tokens":30,"stream":true,"stream_options":{"include_usage":true}`,
		`"stop":[" the"," of"],"max_tokens":60`,
		`"stop":"e","stream":true,"max_tokens":60`,
		`"max_tokens":1`,
	} {
		prompt := promptWords("w", 3+7*i) + " once upon a time"
		bodies = append(bodies,
			struct {
				api  API
				body string
			}{APIChat, chatJSON(extra, "system", "be brief", "user", prompt)},
			struct {
				api  API
				body string
			}{APICompletion, completionJSON(prompt, extra)})
	}
	// All at once, so that they share steps.
	var (
		wg   sync.WaitGroup
		got  = make([]exchange, len(bodies))
		want = make([]exchange, len(bodies))
	)
	for i, b := range bodies {
		wg.Go(func() { got[i] = fetch(t.Context(), bsrv.URL, b.api, b.body) })
		wg.Go(func() { want[i] = fetch(t.Context(), csrv.URL, b.api, b.body) })
	}
	wg.Wait()
	for i, b := range bodies {
		g, w := parse(t, b.api, got[i]), parse(t, b.api, want[i])
		if g.status != http.StatusOK || g.text != w.text || g.finish != w.finish || (g.usage == nil) != (w.usage == nil) ||
			(g.usage != nil && *g.usage != *w.usage) {
			t.Fatalf("%s: batch model gives %s, constant model %s", b.body, g.raw, w.raw)
		}
		if x := mustExpect(t, b.api, b.body); g.text != x.Text {
			t.Fatalf("%s: got %q, want %q", b.body, g.text, x.Text)
		}
	}
	for _, b := range bodies[:4] {
		tr := mustStream(t, batch, b.api, b.body)
		if x := mustExpect(t, b.api, b.body); tr.text() != x.Text || tr.finish != x.FinishReason {
			t.Fatalf("%s: Stream gives %q (%s), want %q", b.body, tr.text(), tr.finish, x.Text)
		}
	}
}

// Without a stepper the batch model runs on real time, paced by its steps.
func TestBatchRealTime(t *testing.T) {
	cfg := testConfig()
	cfg.Batch = BatchModel{Enabled: true, StepTime: 200 * time.Microsecond, StepPerPrefillToken: time.Microsecond}
	e := newTestEngine(t, cfg)
	if e.cfg.Batch.MaxBatchedTokens != DefaultMaxBatchedTokens {
		t.Fatalf("max batched tokens %d, want the default", e.cfg.Batch.MaxBatchedTokens)
	}
	body := chatJSON(`"max_tokens":20`, "user", "hello there")
	tr := mustStream(t, e, APIChat, body)
	if x := mustExpect(t, APIChat, body); tr.text() != x.Text {
		t.Fatalf("got %q, want %q", tr.text(), x.Text)
	}
}

// A request cancelled while in the batch leaves it.
func TestBatchCancel(t *testing.T) {
	cfg := testConfig()
	cfg.Batch = testBatch()
	e := newTestEngine(t, cfg)
	st := newStepper(e)
	ctx, cancel := context.WithCancel(t.Context())
	s := goStream(ctx, e, APICompletion, decodeOnly(t, promptWords("c", 3), 10))
	waitBatch(t, e, 1)
	if r := st.step(t); !slices.Equal(r.outputs, []uint64{1}) {
		t.Fatalf("first step gave outputs to %v", r.outputs)
	}
	cancel()
	<-s.done
	if !errors.Is(s.err, context.Canceled) {
		t.Fatalf("cancelled stream: %v", s.err)
	}
	waitBatch(t, e, 0)
	// The step goroutine, let through its gate if it waits there, finds
	// the batch empty and ends.
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		select {
		case st.gate <- struct{}{}:
		default:
		}
		e.batch.mu.Lock()
		defer e.batch.mu.Unlock()
		if e.batch.active {
			return errors.New("step goroutine still running")
		}
		return nil
	})
	if e.Aborted() != 1 {
		t.Fatalf("aborted %d", e.Aborted())
	}
}

func TestBatchModelValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    BatchModel
		ok   bool
	}{
		{"defaults", func() BatchModel { m := DefaultBatchModel(); m.Enabled = true; return m }(), true},
		{"zero enabled", BatchModel{Enabled: true}, true},
		{"negative tokens", BatchModel{Enabled: true, MaxBatchedTokens: -1}, false},
		{"negative step", BatchModel{Enabled: true, StepTime: -1}, false},
		{"negative per seq", BatchModel{Enabled: true, StepPerSeq: -1}, false},
		{"negative per prefill token", BatchModel{Enabled: true, StepPerPrefillToken: -1}, false},
		{"negative transfer", BatchModel{Enabled: true, KVTransferPerToken: -1}, false},
		{"disabled is not checked", BatchModel{StepTime: -1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Batch = tc.m
			err := cfg.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}
