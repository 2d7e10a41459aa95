package broker

import (
	"fmt"
	"math"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/wire"
)

// timingCall is a call of a broker whose clock the test sets, for feeding
// the timing hooks synthetic chunk times.
func timingCall(t *testing.T, now *time.Time, route dispatch.Route, targets Targets) *Call {
	t.Helper()
	b := &Broker{now: func() time.Time { return *now }, metrics: NewMetrics()}
	b.cfg.Targets = targets
	c := &Call{b: b, Model: "m", Route: route, Started: *now}
	c.attemptStart = *now
	return c
}

func accepted(agent string, stage wire.Chunk_Stage) *wire.Chunk {
	return &wire.Chunk{Kind: wire.Chunk_KIND_ACCEPTED, AgentId: agent, Stage: stage}
}

func near(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= float64(time.Microsecond)
}

func TestTimingRegular(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	c := timingCall(t, &now, dispatch.RouteRegular, Targets{})
	ms := time.Millisecond
	// Two requests on agent a: the first waits 10ms in the queue and
	// prefills 1000 tokens in 100ms, the second waits 30ms and prefills
	// 2000 tokens in 300ms. Tokens come every 20ms, then every 40ms.
	for i, r := range []struct {
		wait, prefill time.Duration
		tokens        int
		gap           time.Duration
	}{{10 * ms, 100 * ms, 1000, 20 * ms}, {30 * ms, 300 * ms, 2000, 40 * ms}} {
		now = t0.Add(time.Duration(i) * time.Minute)
		c.Started, c.attemptStart = now, now
		c.tm = callTiming{tokens: r.tokens}
		c.firstToken, c.lastToken, c.tokens = time.Time{}, time.Time{}, 0
		now = now.Add(r.wait)
		c.timeAccepted(accepted("a", wire.Chunk_STAGE_MAIN))
		c.agent = "a"
		now = now.Add(r.prefill)
		for range itlFoldEvery + 1 {
			c.timeToken(now, 1)
			now = now.Add(r.gap)
		}
		// The engine reports what it prefilled: 100 tokens were cached.
		c.timeFinal(usageFinal(r.tokens+100, 100))
		// The first streams 20 tokens, the second 40; a failed
		// request's length is not learned.
		c.tokens = 20 * (i + 1)
		c.timeDone(OutcomeOK)
		c.tokens = 5
		c.timeDone(OutcomeError)
	}
	got := c.b.timing.of("m", "a")
	if got.Samples != 2 {
		t.Fatalf("samples %d, want 2", got.Samples)
	}
	// The first figure is taken as it is, the second weighs timingAlpha.
	ewma := func(a, b time.Duration) time.Duration { return a + time.Duration(timingAlpha*float64(b-a)) }
	if want := ewma(10*ms, 30*ms); !near(got.QueueWait, want) {
		t.Errorf("queue wait %v, want %v", got.QueueWait, want)
	}
	if want := ewma(110*ms, 330*ms); !near(got.TTFT, want) {
		t.Errorf("TTFT %v, want %v", got.TTFT, want)
	}
	if want := ewma(20*ms, 40*ms); !near(got.ITL, want) {
		t.Errorf("ITL %v, want %v", got.ITL, want)
	}
	// The first prefill folds at once; the second waits in the window
	// until a second of busy time has gathered.
	if want := 1000 / 0.1; math.Abs(got.PrefillRate-want) > 1e-6 {
		t.Errorf("prefill rate %v, want %v", got.PrefillRate, want)
	}
	if want := 20 + timingAlpha*(40-20); math.Abs(got.OutputTokens-want) > 1e-9 {
		t.Errorf("output tokens %v, want %v", got.OutputTokens, want)
	}
	if got.Updated.IsZero() {
		t.Error("Updated not set")
	}
	if o := c.b.timing.of("m", "b"); o.Samples != 0 {
		t.Errorf("agent b has %+v, want nothing", o)
	}
}

func usageFinal(prompt, cached int) *wire.Chunk {
	return &wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Raw: fmt.Appendf(nil,
		`{"id":"x","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":3,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
		prompt, prompt+3, cached)}
}

// Prompts prefilled together share the agent's busy time: three requests
// accepted at once whose first tokens come at 100, 200 and 300ms, each
// 1000 tokens prefilled, teach 10000 tokens/s, the engine's throughput,
// not the 5000 of each one's own wait. An engine that reports no cached
// tokens teaches no rate and is marked.
func TestTimingPrefillShared(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	ms := time.Millisecond
	calls := make([]*Call, 3)
	b := timingCall(t, &now, dispatch.RouteRegular, Targets{}).b
	for i := range calls {
		c := &Call{b: b, Model: "m", Route: dispatch.RouteRegular, Started: now}
		c.agent = "a"
		c.attemptStart = now
		c.timeAccepted(accepted("a", wire.Chunk_STAGE_MAIN))
		calls[i] = c
	}
	for i, c := range calls {
		now = t0.Add(time.Duration(i+1) * 100 * ms)
		c.timeToken(now, 1)
	}
	for _, c := range calls {
		c.timeFinal(usageFinal(1500, 500))
		c.timeDone(OutcomeOK)
	}
	if got := b.timing.of("m", "a"); math.Abs(got.PrefillRate-10000) > 1e-6 || got.CacheUnreported {
		t.Fatalf("timing %+v, want 10000 tokens/s", got)
	}
	c := &Call{b: b, Model: "m", Route: dispatch.RouteRegular, Started: now}
	c.agent = "u"
	c.attemptStart = now
	c.timeAccepted(accepted("u", wire.Chunk_STAGE_MAIN))
	now = now.Add(100 * ms)
	c.timeToken(now, 1)
	c.timeFinal(&wire.Chunk{Kind: wire.Chunk_KIND_FINAL, Raw: []byte(`{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`)})
	c.timeDone(OutcomeOK)
	if got := b.timing.of("m", "u"); got.PrefillRate != 0 || !got.CacheUnreported {
		t.Fatalf("timing %+v, want no rate and the cache unreported", got)
	}
}

func TestTimingPD(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	ms := time.Millisecond
	c := timingCall(t, &now, dispatch.RoutePD, Targets{})
	c.tm = callTiming{tokens: 4000}
	now = t0.Add(5 * ms)
	c.timeAccepted(accepted("p", wire.Chunk_STAGE_PREFILL))
	c.prefillAgent = "p"
	now = now.Add(200 * ms)
	c.handedOff = now
	c.timeHandOff([]byte(`{"id":"p","choices":[],"usage":{"prompt_tokens":4100,"completion_tokens":1,"total_tokens":4101,"prompt_tokens_details":{"cached_tokens":100}}}`))
	now = now.Add(15 * ms)
	c.timeAccepted(accepted("d", wire.Chunk_STAGE_MAIN)) // the decode leg's: no figure
	c.agent = "d"
	now = now.Add(25 * ms)
	c.timeToken(now, 1)
	for range itlFoldEvery / 2 {
		now = now.Add(10 * ms)
		c.timeToken(now, 2) // two tokens per message: 5ms each
	}
	p, d := c.b.timing.of("m", "p"), c.b.timing.of("m", "d")
	if p.Samples != 1 || !near(p.QueueWait, 5*ms) || !near(p.TTFT, 205*ms) || math.Abs(p.PrefillRate-4000/0.2) > 1e-6 || p.ITL != 0 {
		t.Errorf("prefill agent %+v; want wait 5ms, TTFT 205ms, 20000 tokens/s", p)
	}
	if d.Samples != 1 || !near(d.TTFT, 40*ms) || !near(d.ITL, 5*ms) || d.QueueWait != 0 || d.PrefillRate != 0 {
		t.Errorf("decode agent %+v; want TTFT 40ms (hand-off to first token), ITL 5ms", d)
	}
}

func TestTimingAttainment(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	ms := time.Millisecond
	for _, tt := range []struct {
		name      string
		targets   Targets
		ttft, gap time.Duration
		outcome   string
		result    string // "" when not counted
	}{
		{"met", Targets{TTFT: 100 * ms, ITL: 20 * ms}, 50 * ms, 10 * ms, OutcomeOK, "met"},
		{"ttft missed", Targets{TTFT: 100 * ms, ITL: 20 * ms}, 150 * ms, 10 * ms, OutcomeOK, "missed"},
		{"itl missed", Targets{ITL: 20 * ms}, 50 * ms, 30 * ms, OutcomeOK, "missed"},
		{"no targets", Targets{}, 50 * ms, 30 * ms, OutcomeOK, ""},
		{"failed", Targets{TTFT: time.Second}, 50 * ms, 10 * ms, OutcomeError, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := timingCall(t, &now, dispatch.RouteRegular, tt.targets)
			c.firstToken = t0.Add(tt.ttft)
			c.tokens = 11
			c.lastToken = c.firstToken.Add(10 * tt.gap)
			c.timeDone(tt.outcome)
			a := c.b.SLOAttainment("m", dispatch.RouteRegular)
			want := Attainment{}
			switch tt.result {
			case "met":
				want.Met = 1
			case "missed":
				want.Missed = 1
			}
			if a != want {
				t.Fatalf("attainment %+v, want %+v", a, want)
			}
			if tt.result != "" {
				var m dto.Metric
				if err := c.b.metrics.slo.WithLabelValues("m", "regular", tt.result).Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
					t.Fatalf("switchyard_slo_requests_total{result=%q} = %v (%v), want 1", tt.result, m.GetCounter().GetValue(), err)
				}
			}
		})
	}
}

// A request's own targets win over the broker's defaults, field by field.
func TestTargetsDefaults(t *testing.T) {
	now := time.Unix(1000, 0)
	c := timingCall(t, &now, dispatch.RouteRegular, Targets{TTFT: time.Second, ITL: 50 * time.Millisecond})
	c.req.Targets = Targets{ITL: 20 * time.Millisecond}
	if got, want := c.targets(), (Targets{TTFT: time.Second, ITL: 20 * time.Millisecond}); got != want {
		t.Fatalf("targets %+v, want %+v", got, want)
	}
}

// A request's prefilled tokens are learned per request, though the rate
// folds per second of busy time: twelve requests of 1,000 prefilled
// tokens, 100ms each, teach 1,000 tokens a request (not the 10,000 of a
// window). Requests taken and not past their prefill count as in prefill.
func TestTimingPrefillTokensPerRequest(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	b := timingCall(t, &now, dispatch.RouteRegular, Targets{}).b
	for range 12 {
		c := &Call{b: b, Model: "m", Route: dispatch.RouteRegular, Started: now}
		c.agent = "a"
		c.attemptStart = now
		c.timeAccepted(accepted("a", wire.Chunk_STAGE_MAIN))
		now = now.Add(100 * time.Millisecond)
		c.timeToken(now, 1)
		c.timeFinal(usageFinal(1200, 200))
		c.timeDone(OutcomeOK)
	}
	got := b.timing.of("m", "a")
	if math.Abs(got.PrefillTokens-1000) > 1e-6 || math.Abs(got.PrefillRate-10000) > 1e-6 || got.InPrefill != 0 {
		t.Fatalf("timing %+v, want 1000 tokens a request at 10000 tokens/s, none in prefill", got)
	}
	for range 2 {
		c := &Call{b: b, Model: "m", Route: dispatch.RouteRegular, Started: now}
		c.attemptStart = now
		c.timeAccepted(accepted("a", wire.Chunk_STAGE_MAIN))
	}
	if got := b.timing.of("m", "a"); got.InPrefill != 2 {
		t.Fatalf("in prefill %d, want 2", got.InPrefill)
	}
}
