package simengine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-ai/switchyard/internal/promtext"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

// heldKV is a prefill engine's hold accounting, for comparisons.
type heldKV struct {
	handoffs, blocks   int
	expired, abandoned int64
}

func heldOf(e *Engine) heldKV {
	h, b := e.HeldKV()
	return heldKV{h, b, e.HandoffsExpired(), e.HandoffsAbandoned()}
}

// waitHeld polls until e's accounting is want.
func waitHeld(t *testing.T, e *Engine, want heldKV) {
	t.Helper()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if got := heldOf(e); got != want {
			return fmt.Errorf("held %+v, want %+v", got, want)
		}
		return nil
	})
}

// longPrompt has n words, so that its KV spans several blocks.
func longPrompt(n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = "word" + itoa(i)
	}
	return strings.Join(w, " ")
}

// blocksFor is the KV blocks a hand-off of body holds.
func blocksFor(t *testing.T, api API, body string) int {
	t.Helper()
	p := mustExpect(t, api, body).PromptTokens
	return (p + KVBlockSize - 1) / KVBlockSize
}

// A vLLM prefill holds ceil(prompt tokens / 16) blocks from its end until
// the decode reads them; a second read finds nothing.
func TestVLLMHoldReleasedByDecode(t *testing.T) {
	pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	_, dsrv := pdEngine(t, pdConfig(RoleDecode, PDVLLM))
	for _, tc := range []struct {
		name   string
		api    API
		prompt string
	}{
		{"short chat", APIChat, "hi"},
		{"long completion", APICompletion, longPrompt(100)},
		{"long chat", APIChat, longPrompt(47)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := heldOf(pe)
			blocks := blocksFor(t, tc.api, bodyFor(tc.api, tc.prompt, ""))
			if tc.prompt != "hi" && blocks < 3 {
				t.Fatalf("%d blocks: the prompt should span several", blocks)
			}
			kv := vllmPrefill(t, psrv.URL, tc.api, tc.prompt)
			var p KVTransferParams
			if err := json.Unmarshal(kv, &p); err != nil || len(p.RemoteBlockIDs) != blocks {
				t.Fatalf("kv_transfer_params %s (%v), want %d block ids", kv, err, blocks)
			}
			if got, want := heldOf(pe), (heldKV{1, blocks, before.expired, before.abandoned}); got != want {
				t.Fatalf("after prefill: held %+v, want %+v", got, want)
			}
			body := bodyFor(tc.api, tc.prompt, `"max_tokens":3,"kv_transfer_params":`+string(kv))
			do(t, t.Context(), dsrv.URL, tc.api, body).matches(t, tc.api, bodyFor(tc.api, tc.prompt, `"max_tokens":3`))
			if got, want := heldOf(pe), (heldKV{0, 0, before.expired, before.abandoned}); got != want {
				t.Fatalf("after decode: held %+v, want %+v", got, want)
			}
			do(t, t.Context(), dsrv.URL, tc.api, body).kvFailed(t)
		})
	}
}

// A hand-off no decode reads is freed at the hold timeout and counted; a
// decode arriving later fails.
func TestVLLMHoldExpires(t *testing.T) {
	pcfg := pdConfig(RolePrefill, PDVLLM)
	pcfg.KVHoldTimeout = 50 * time.Millisecond
	pe, psrv := pdEngine(t, pcfg)
	_, dsrv := pdEngine(t, pdConfig(RoleDecode, PDVLLM))
	prompt := longPrompt(40)
	kv := vllmPrefill(t, psrv.URL, APIChat, prompt)
	vllmPrefill(t, psrv.URL, APIChat, "hi")
	// Counted as expired, each was held (a read or an abort would not
	// count).
	waitHeld(t, pe, heldKV{expired: 2})
	res := do(t, t.Context(), dsrv.URL, APIChat, bodyFor(APIChat, prompt, `"kv_transfer_params":`+string(kv)))
	res.kvFailed(t)
	if !strings.Contains(res.err.Message, "expired") {
		t.Fatalf("message %q", res.err.Message)
	}
	if _, body := get(t, psrv.URL+"/metrics"); !strings.Contains(body, `switchyard_sim_pd_handoffs_expired_total{model_name="sim-model"} 2`) {
		t.Fatalf("/metrics:\n%s", body)
	}
}

// A decode request aborted before it read its KV (here, queued behind
// another for the decode engine's only slot) tells the prefill, which
// frees the KV at once, as vLLM's NixlConnector does.
func TestVLLMHoldFreedByAbortedDecode(t *testing.T) {
	pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDVLLM))
	dcfg := pdConfig(RoleDecode, PDVLLM)
	dcfg.Slots = 1
	dcfg.ITL = 10 * time.Millisecond
	de, _ := pdEngine(t, dcfg)

	running := vllmPrefill(t, psrv.URL, APICompletion, "first")
	queued := vllmPrefill(t, psrv.URL, APICompletion, longPrompt(20))
	waitHeld(t, pe, heldKV{handoffs: 2, blocks: 1 + blocksFor(t, APICompletion, completionJSON(longPrompt(20), ""))})

	rctx, rcancel := context.WithCancel(t.Context())
	defer rcancel()
	rdone := make(chan error, 1)
	go func() {
		rdone <- de.Stream(rctx, APICompletion, []byte(completionJSON("first", `"max_tokens":100000,"kv_transfer_params":`+string(running))),
			func([]byte) error { return nil })
	}()
	// The running decode has read its hand-off.
	waitHeld(t, pe, heldKV{handoffs: 1, blocks: blocksFor(t, APICompletion, completionJSON(longPrompt(20), ""))})

	qctx, qcancel := context.WithCancel(t.Context())
	qdone := make(chan error, 1)
	go func() {
		qdone <- de.Stream(qctx, APICompletion, []byte(completionJSON(longPrompt(20), `"kv_transfer_params":`+string(queued))),
			func([]byte) error { return errors.New("emit called") })
	}()
	testwait.For(t, 10*time.Second, time.Millisecond, func() error {
		if l := de.Load(); l.Running != 1 || l.Waiting != 1 {
			return fmt.Errorf("decode load %+v", l)
		}
		return nil
	})
	qcancel()
	if err := <-qdone; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued decode: %v", err)
	}
	waitHeld(t, pe, heldKV{abandoned: 1})
	rcancel()
	if err := <-rdone; !errors.Is(err, context.Canceled) {
		t.Fatalf("running decode: %v", err)
	}
	if got := heldOf(pe); got != (heldKV{abandoned: 1}) {
		t.Fatalf("a decode aborted after reading its KV changed the prefill's accounting: %+v", got)
	}
}

// A vLLM prefill aborted after its KV was computed but before its last
// token frees the KV at once: vLLM holds KV only for a request that
// finished by length.
func TestVLLMPrefillAbortedBeforeFinish(t *testing.T) {
	pcfg := pdConfig(RolePrefill, PDVLLM)
	pcfg.ITL = time.Hour
	pe, _ := pdEngine(t, pcfg)
	body := strings.Replace(completionJSON("hi", vllmPrefillParams), `"max_tokens":1`, `"max_tokens":2`, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- pe.Stream(ctx, APICompletion, []byte(body), func([]byte) error { return nil }) }()
	waitHeld(t, pe, heldKV{handoffs: 1, blocks: 1})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("prefill: %v", err)
	}
	if got := heldOf(pe); got != (heldKV{abandoned: 1}) {
		t.Fatalf("held %+v", got)
	}
}

// An SGLang prefill holds its room's KV from its end until the decode
// reads it, or until the hold timeout.
func TestSGLangHold(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		decode  bool // whether a decode reads the room
		want    heldKV
	}{
		{"read", time.Hour, true, heldKV{}},
		{"expired", 50 * time.Millisecond, false, heldKV{expired: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pcfg := pdConfig(RolePrefill, PDSGLang)
			pcfg.KVHoldTimeout = tc.timeout
			pe, psrv := pdEngine(t, pcfg)
			dcfg := pdConfig(RoleDecode, PDSGLang)
			dcfg.BootstrapTimeout = 100 * time.Millisecond
			_, dsrv := pdEngine(t, dcfg)
			prompt := longPrompt(50)
			body := bodyFor(APICompletion, prompt, `"max_tokens":4,`+sglangFields(pe.BootstrapPort(), "77"))
			do(t, t.Context(), psrv.URL, APICompletion, body).matches(t, APICompletion, bodyFor(APICompletion, prompt, `"max_tokens":1`))
			blocks := blocksFor(t, APICompletion, body)
			if tc.decode {
				if got := heldOf(pe); got != (heldKV{handoffs: 1, blocks: blocks}) {
					t.Fatalf("after prefill: held %+v, want 1 hand-off of %d blocks", got, blocks)
				}
				do(t, t.Context(), dsrv.URL, APICompletion, body).matches(t, APICompletion, bodyFor(APICompletion, prompt, `"max_tokens":4`))
			}
			waitHeld(t, pe, tc.want)
			if !tc.decode {
				// The room is gone: a decode waits for it in vain.
				do(t, t.Context(), dsrv.URL, APICompletion, body).kvFailed(t)
			}
		})
	}
}

// SGLang's decode-side abort: a decode aborted while its room is pending
// fails the room (its prefill will hold nothing); one aborted once the
// room is done, before reading it, frees the KV.
func TestSGLangHoldFreedByAbortedDecode(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		pcfg := pdConfig(RolePrefill, PDSGLang)
		pcfg.TTFT = time.Hour
		pe, _ := pdEngine(t, pcfg)
		dcfg := pdConfig(RoleDecode, PDSGLang)
		dcfg.BootstrapTimeout = time.Hour
		de, _ := pdEngine(t, dcfg)
		body := []byte(completionJSON("hi", sglangFields(pe.BootstrapPort(), "3")))

		pctx, pcancel := context.WithCancel(t.Context())
		pdone := make(chan error, 1)
		go func() { pdone <- pe.Stream(pctx, APICompletion, body, func([]byte) error { return nil }) }()
		dctx, dcancel := context.WithCancel(t.Context())
		ddone := make(chan error, 1)
		go func() { ddone <- de.Stream(dctx, APICompletion, body, func([]byte) error { return nil }) }()
		testwait.For(t, 10*time.Second, time.Millisecond, func() error {
			if pl, dl := pe.Load(), de.Load(); pl.Running != 1 || dl.Running != 1 {
				return fmt.Errorf("prefill %+v decode %+v", pl, dl)
			}
			return nil
		})
		dcancel()
		if err := <-ddone; !errors.Is(err, context.Canceled) {
			t.Fatalf("decode: %v", err)
		}
		// The room has failed: another decode on it learns so at once.
		de2, _ := pdEngine(t, dcfg)
		err := de2.Stream(t.Context(), APICompletion, body, func([]byte) error { return errors.New("emit called") })
		if !errors.Is(err, ErrKVTransfer) || !strings.Contains(err.Error(), "aborted") {
			t.Fatalf("second decode: %v", err)
		}
		pcancel()
		if err := <-pdone; !errors.Is(err, context.Canceled) {
			t.Fatalf("prefill: %v", err)
		}
		if got := heldOf(pe); got != (heldKV{}) {
			t.Fatalf("held %+v", got)
		}
	})
	t.Run("done", func(t *testing.T) {
		pe, psrv := pdEngine(t, pdConfig(RolePrefill, PDSGLang))
		dcfg := pdConfig(RoleDecode, PDSGLang)
		dcfg.Slots = 1
		dcfg.ITL = 10 * time.Millisecond
		de, _ := pdEngine(t, dcfg)
		first := completionJSON("first", `"max_tokens":100000,`+sglangFields(pe.BootstrapPort(), "1"))
		second := completionJSON("second", sglangFields(pe.BootstrapPort(), "2"))
		do(t, t.Context(), psrv.URL, APICompletion, first)
		do(t, t.Context(), psrv.URL, APICompletion, second)
		waitHeld(t, pe, heldKV{handoffs: 2, blocks: 2})

		rctx, rcancel := context.WithCancel(t.Context())
		defer rcancel()
		rdone := make(chan error, 1)
		go func() { rdone <- de.Stream(rctx, APICompletion, []byte(first), func([]byte) error { return nil }) }()
		waitHeld(t, pe, heldKV{handoffs: 1, blocks: 1})
		qctx, qcancel := context.WithCancel(t.Context())
		qdone := make(chan error, 1)
		go func() { qdone <- de.Stream(qctx, APICompletion, []byte(second), func([]byte) error { return nil }) }()
		testwait.For(t, 10*time.Second, time.Millisecond, func() error {
			if l := de.Load(); l.Running != 1 || l.Waiting != 1 {
				return fmt.Errorf("decode load %+v", l)
			}
			return nil
		})
		qcancel()
		if err := <-qdone; !errors.Is(err, context.Canceled) {
			t.Fatalf("queued decode: %v", err)
		}
		waitHeld(t, pe, heldKV{abandoned: 1})
		rcancel()
		<-rdone
	})
}

// Close frees what a prefill engine holds without counting it as expired.
func TestCloseFreesHeldKV(t *testing.T) {
	for _, proto := range []PDProtocol{PDVLLM, PDSGLang} {
		t.Run(string(proto), func(t *testing.T) {
			pe, psrv := pdEngine(t, pdConfig(RolePrefill, proto))
			body := completionJSON("hi", vllmPrefillParams)
			if proto == PDSGLang {
				body = completionJSON("hi", sglangFields(pe.BootstrapPort(), "8"))
			}
			do(t, t.Context(), psrv.URL, APICompletion, body)
			if got := heldOf(pe); got != (heldKV{handoffs: 1, blocks: 1}) {
				t.Fatalf("held %+v", got)
			}
			if err := pe.Close(); err != nil {
				t.Fatal(err)
			}
			if got := heldOf(pe); got != (heldKV{}) {
				t.Fatalf("after Close: held %+v", got)
			}
		})
	}
}

// /metrics shows the held hand-offs and blocks and the expired count.
func TestHeldKVMetrics(t *testing.T) {
	pcfg := pdConfig(RolePrefill, PDVLLM)
	pcfg.KVHoldTimeout = time.Hour
	_, psrv := pdEngine(t, pcfg)
	prompt := longPrompt(60)
	blocks := blocksFor(t, APIChat, bodyFor(APIChat, prompt, ""))
	vllmPrefill(t, psrv.URL, APIChat, prompt)
	vllmPrefill(t, psrv.URL, APIChat, "hi")
	m, err := promtext.Fetch(t.Context(), psrv.Client(), psrv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name  string
		typ   dto.MetricType
		value float64
	}{
		{"switchyard_sim_pd_handoffs_held", dto.MetricType_GAUGE, 2},
		{"switchyard_sim_pd_kv_held_blocks", dto.MetricType_GAUGE, float64(blocks + 1)},
		{"switchyard_sim_pd_handoffs_expired_total", dto.MetricType_COUNTER, 0},
		{"switchyard_sim_pd_handoffs_abandoned_total", dto.MetricType_COUNTER, 0},
	} {
		if typ := m[want.name].GetType(); typ != want.typ || len(m.Samples(want.name, "model_name", "sim-model")) != 1 {
			t.Errorf("%s: a %v with %d sim-model series, want one %v", want.name, typ, len(m.Samples(want.name, "model_name", "sim-model")), want.typ)
		}
		if got := m.Sum(want.name, "model_name", "sim-model"); got != want.value {
			t.Errorf("%s = %v, want %v", want.name, got, want.value)
		}
	}

	// A regular engine reports zeros.
	rsrv := newTestServer(t, newTestEngine(t, testConfig()))
	m, err = promtext.Fetch(t.Context(), rsrv.Client(), rsrv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Samples("switchyard_sim_pd_kv_held_blocks", "model_name", "sim-model"); len(s) != 1 || s[0].Value != 0 {
		t.Errorf("regular engine's held blocks: %+v, want one series at 0", s)
	}
}
