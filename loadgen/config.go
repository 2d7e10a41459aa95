package loadgen

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// API selects the OpenAI endpoint requests go to.
type API string

const (
	// APIChat is POST {URL}/v1/chat/completions.
	APIChat API = "chat"
	// APICompletion is POST {URL}/v1/completions.
	APICompletion API = "completion"
)

func (a API) path() string {
	if a == APICompletion {
		return "/v1/completions"
	}
	return "/v1/chat/completions"
}

// Config describes one benchmark run. Zero values of optional fields mean
// "off"; Validate reports what is missing.
type Config struct {
	// URL is the server's base URL, such as http://127.0.0.1:8080; the API
	// path is appended.
	URL string
	// API is APIChat (also the zero value) or APICompletion.
	API API
	// Model is sent as the request's model.
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>".
	APIKey string

	// Concurrency is the number of closed-loop workers without Rate, or the
	// cap on requests in flight with it (0: no cap).
	Concurrency int
	// Rate is the mean of Poisson arrivals in requests per second; 0 selects
	// fixed concurrency, +Inf sends every request at once (Requests must
	// then be set).
	Rate float64
	// Seed seeds the arrival process and the synthetic prompts, so two runs
	// with the same Seed send the same requests at the same offsets.
	Seed uint64

	// Requests stops the run after this many measured requests (warm-up
	// excluded); Duration stops issuing requests once the measured window is
	// this long. At least one is required; with both, the first reached
	// stops the run. In-flight requests are always waited for.
	Requests int
	Duration time.Duration
	// WarmupRequests and WarmupDuration mark the first requests, or those
	// issued in the first WarmupDuration, as warm-up: sent but excluded
	// from the statistics.
	WarmupRequests int
	WarmupDuration time.Duration

	// PromptTokens is the length of synthetic prompts, in words (a word is
	// about a token, and exactly one for the simulated engine).
	PromptTokens Dist
	// MaxTokens is each request's max_tokens.
	MaxTokens Dist
	// Prompts, when not empty, replaces synthetic prompts: request i sends
	// Prompts[i % len(Prompts)] (see [ReadPrompts]).
	Prompts []Prompt

	// SLO defines goodput; see [SLO].
	SLO SLO
	// Timeout bounds each request from send to [DONE] (0: no bound);
	// exceeding it counts as a "timeout" error.
	Timeout time.Duration
}

// Validate reports every missing or out-of-range field.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("url must be an absolute http(s) URL, got %q", c.URL)
	}
	switch c.API {
	case "", APIChat, APICompletion:
	default:
		bad("api must be chat or completion, got %q", c.API)
	}
	if c.Model == "" {
		bad("model is required")
	}
	if c.Concurrency < 0 {
		bad("concurrency must not be negative, got %d", c.Concurrency)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) {
		bad("rate must not be negative, got %v", c.Rate)
	}
	if c.Rate == 0 && c.Concurrency == 0 {
		bad("set concurrency or rate")
	}
	if math.IsInf(c.Rate, 1) && c.Requests == 0 {
		bad("an infinite rate needs a request count")
	}
	if c.Requests < 0 || c.Duration < 0 || c.WarmupRequests < 0 || c.WarmupDuration < 0 || c.Timeout < 0 {
		bad("counts and durations must not be negative")
	}
	if c.Requests == 0 && c.Duration == 0 {
		bad("set a request count or a duration")
	}
	if len(c.Prompts) == 0 {
		if err := c.PromptTokens.validate("prompt tokens"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.MaxTokens.validate("max tokens"); err != nil {
		needed := len(c.Prompts) == 0
		for _, p := range c.Prompts {
			needed = needed || p.MaxTokens == 0
		}
		if needed {
			errs = append(errs, err)
		}
	}
	for i, p := range c.Prompts {
		if err := p.validate(c.API); err != nil {
			errs = append(errs, fmt.Errorf("prompt %d: %w", i+1, err))
		}
	}
	if c.SLO.TTFT < 0 || c.SLO.TPOT < 0 || c.SLO.E2E < 0 {
		bad("SLOs must not be negative")
	}
	return errors.Join(errs...)
}

// Dist is a distribution of token counts: uniform over [Min, Max], fixed
// when Min == Max.
type Dist struct {
	Min, Max int
}

// Fixed returns the distribution that is always n.
func Fixed(n int) Dist { return Dist{n, n} }

// ParseDist parses "fixed:N", "uniform:A-B" or a plain "N".
func ParseDist(s string) (Dist, error) {
	kind, arg, found := strings.Cut(s, ":")
	if !found {
		kind, arg = "fixed", s
	}
	var d Dist
	var err error
	switch kind {
	case "fixed":
		d.Min, err = strconv.Atoi(arg)
		d.Max = d.Min
	case "uniform":
		lo, hi, ok := strings.Cut(arg, "-")
		if !ok {
			return Dist{}, fmt.Errorf("%w: %q: uniform needs A-B", ErrInvalidConfig, s)
		}
		if d.Min, err = strconv.Atoi(lo); err == nil {
			d.Max, err = strconv.Atoi(hi)
		}
	default:
		return Dist{}, fmt.Errorf("%w: %q: want fixed:N, uniform:A-B or N", ErrInvalidConfig, s)
	}
	if err != nil {
		return Dist{}, fmt.Errorf("%w: %q: %v", ErrInvalidConfig, s, err)
	}
	if err := d.validate("distribution"); err != nil {
		return Dist{}, fmt.Errorf("%q: %w", s, err)
	}
	return d, nil
}

func (d Dist) validate(what string) error {
	if d.Min < 1 || d.Max < d.Min {
		return fmt.Errorf("%w: %s must be at least 1 with min <= max, got %s", ErrInvalidConfig, what, d)
	}
	return nil
}

// String returns the form ParseDist reads.
func (d Dist) String() string {
	if d.Min == d.Max {
		return "fixed:" + strconv.Itoa(d.Min)
	}
	return "uniform:" + strconv.Itoa(d.Min) + "-" + strconv.Itoa(d.Max)
}

// sample draws from d; intn is a seeded rand.Rand's IntN.
func (d Dist) sample(intn func(int) int) int {
	if d.Max <= d.Min {
		return d.Min
	}
	return d.Min + intn(d.Max-d.Min+1)
}

// SLO holds per-request service-level objectives; zero fields are not
// checked. A request counts toward goodput when it succeeded and meets
// every set objective (TPOT is met by requests of one token, which have
// none). Without any objective goodput equals request throughput.
type SLO struct {
	TTFT, TPOT, E2E time.Duration
}

func (s SLO) empty() bool { return s == SLO{} }

func (s SLO) met(r *record) bool {
	return (s.TTFT == 0 || r.ttft <= s.TTFT) &&
		(s.TPOT == 0 || r.outTokens < 2 || r.tpot() <= s.TPOT) &&
		(s.E2E == 0 || r.e2e <= s.E2E)
}

// ParseSLO parses "ttft=200ms,tpot=50ms,e2e=2s": keys ttft, tpot and e2e
// (or e2el), values a Go duration or a plain number of milliseconds, as
// vLLM's --goodput takes them.
func ParseSLO(s string) (SLO, error) {
	var slo SLO
	if strings.TrimSpace(s) == "" {
		return slo, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return SLO{}, fmt.Errorf("%w: SLO %q: want key=value", ErrInvalidConfig, part)
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			ms, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil {
				return SLO{}, fmt.Errorf("%w: SLO %q: %v", ErrInvalidConfig, part, err)
			}
			d = time.Duration(ms * float64(time.Millisecond))
		}
		if d <= 0 {
			return SLO{}, fmt.Errorf("%w: SLO %q must be positive", ErrInvalidConfig, part)
		}
		switch strings.ToLower(k) {
		case "ttft":
			slo.TTFT = d
		case "tpot":
			slo.TPOT = d
		case "e2e", "e2el":
			slo.E2E = d
		default:
			return SLO{}, fmt.Errorf("%w: SLO key %q: want ttft, tpot or e2e", ErrInvalidConfig, k)
		}
	}
	return slo, nil
}

// String returns the form ParseSLO reads.
func (s SLO) String() string {
	var parts []string
	for _, kv := range []struct {
		k string
		d time.Duration
	}{{"ttft", s.TTFT}, {"tpot", s.TPOT}, {"e2e", s.E2E}} {
		if kv.d > 0 {
			parts = append(parts, kv.k+"="+kv.d.String())
		}
	}
	return strings.Join(parts, ",")
}
