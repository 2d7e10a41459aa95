package loadgen

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// Summary describes a latency distribution in milliseconds.
type Summary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Summarize sorts ds in place and summarizes it; an empty ds gives zeros.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	slices.Sort(ds)
	var sum float64
	for _, d := range ds {
		sum += float64(d)
	}
	return Summary{
		Mean: ms(sum / float64(len(ds))),
		P50:  ms(Percentile(ds, 50)),
		P90:  ms(Percentile(ds, 90)),
		P99:  ms(Percentile(ds, 99)),
	}
}

func ms(ns float64) float64 { return ns / float64(time.Millisecond) }

// Percentile returns the p-th percentile (0 <= p <= 100) of sorted in
// nanoseconds, interpolating linearly between the closest ranks as
// numpy.percentile does by default. sorted must not be empty.
func Percentile(sorted []time.Duration, p float64) float64 {
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	frac := rank - float64(lo)
	return float64(sorted[lo]) + frac*float64(sorted[hi]-sorted[lo])
}

// Report is a run's result; its JSON form is what the command prints with
// --json.
type Report struct {
	Config ReportConfig `json:"config"`

	// Requests is the number of measured requests that finished, well or
	// not; Completed those that succeeded; Warmup the warm-up requests.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Warmup    int `json:"warmup_requests"`

	DurationS        float64 `json:"duration_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	GoodputPerS      float64 `json:"goodput_per_s"`
	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`

	TTFT Summary `json:"ttft_ms"`
	ITL  Summary `json:"itl_ms"`
	TPOT Summary `json:"tpot_ms"`
	E2E  Summary `json:"e2e_ms"`

	// Errors counts failed measured requests by kind; every kind of
	// [Kinds] is present.
	Errors map[ErrorKind]int `json:"errors"`
}

// ReportConfig echoes the run's settings; the API key is left out.
type ReportConfig struct {
	URL            string  `json:"url"`
	API            API     `json:"api"`
	Model          string  `json:"model"`
	Concurrency    int     `json:"concurrency"`
	Rate           float64 `json:"rate"` // 0: fixed concurrency; -1: infinite
	Seed           uint64  `json:"seed"`
	Requests       int     `json:"requests"`
	DurationS      float64 `json:"duration_s"`
	WarmupRequests int     `json:"warmup_requests"`
	WarmupS        float64 `json:"warmup_s"`
	PromptTokens   string  `json:"prompt_tokens,omitempty"`
	MaxTokens      string  `json:"max_tokens"`
	Prompts        int     `json:"prompts"`
	SLO            string  `json:"slo"`
	TimeoutS       float64 `json:"timeout_s"`
}

func echo(c Config) ReportConfig {
	rc := ReportConfig{
		URL:            c.URL,
		API:            c.API,
		Model:          c.Model,
		Concurrency:    c.Concurrency,
		Rate:           c.Rate,
		Seed:           c.Seed,
		Requests:       c.Requests,
		DurationS:      c.Duration.Seconds(),
		WarmupRequests: c.WarmupRequests,
		WarmupS:        c.WarmupDuration.Seconds(),
		MaxTokens:      c.MaxTokens.String(),
		Prompts:        len(c.Prompts),
		SLO:            c.SLO.String(),
		TimeoutS:       c.Timeout.Seconds(),
	}
	if math.IsInf(c.Rate, 1) {
		rc.Rate = -1 // JSON has no infinity
	}
	if len(c.Prompts) == 0 {
		rc.PromptTokens = c.PromptTokens.String()
	}
	return rc
}

func (r *runner) report() *Report {
	rep := &Report{Config: echo(r.cfg), Errors: map[ErrorKind]int{}}
	for _, k := range Kinds {
		rep.Errors[k] = 0
	}
	var ttft, tpot, e2e, itl []time.Duration
	var first, last time.Duration = math.MaxInt64, 0
	good := 0
	for _, rec := range r.records {
		if rec.warmup {
			rep.Warmup++
			continue
		}
		rep.Requests++
		first = min(first, rec.start)
		last = max(last, rec.end)
		if rec.kind != "" {
			rep.Errors[rec.kind]++
			continue
		}
		rep.Completed++
		rep.InputTokens += int64(rec.promptTokens)
		rep.OutputTokens += int64(rec.outTokens)
		ttft = append(ttft, rec.ttft)
		e2e = append(e2e, rec.e2e)
		if rec.outTokens > 1 {
			tpot = append(tpot, rec.tpot())
		}
		itl = append(itl, rec.itl...)
		if r.cfg.SLO.met(rec) {
			good++
		}
	}
	if rep.Requests > 0 {
		rep.DurationS = (last - first).Seconds()
	}
	if rep.DurationS > 0 {
		rep.RequestsPerS = float64(rep.Completed) / rep.DurationS
		rep.OutputTokensPerS = float64(rep.OutputTokens) / rep.DurationS
		rep.GoodputPerS = float64(good) / rep.DurationS
	}
	rep.TTFT, rep.ITL, rep.TPOT, rep.E2E = Summarize(ttft), Summarize(itl), Summarize(tpot), Summarize(e2e)
	slices.SortFunc(r.records, func(a, b *record) int { return a.index - b.index })
	return rep
}

// WriteTable writes the report for a human reader.
func (rep *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	c := rep.Config
	mode := fmt.Sprintf("concurrency %d", c.Concurrency)
	switch {
	case c.Rate < 0:
		mode = "all at once"
	case c.Rate > 0:
		mode = fmt.Sprintf("Poisson %g req/s", c.Rate)
	}
	if c.Rate != 0 && c.Concurrency > 0 {
		mode += fmt.Sprintf(", at most %d in flight", c.Concurrency)
	}
	fmt.Fprintf(tw, "target\t%s %s (%s)\n", c.URL, c.API, c.Model)
	fmt.Fprintf(tw, "load\t%s\n", mode)
	fmt.Fprintf(tw, "requests\t%d measured, %d completed, %d warm-up\n", rep.Requests, rep.Completed, rep.Warmup)
	fmt.Fprintf(tw, "duration\t%.2f s\n", rep.DurationS)
	fmt.Fprintf(tw, "request throughput\t%.2f req/s\n", rep.RequestsPerS)
	fmt.Fprintf(tw, "output throughput\t%.1f tok/s (%d tokens, %d input)\n", rep.OutputTokensPerS, rep.OutputTokens, rep.InputTokens)
	if c.SLO != "" {
		fmt.Fprintf(tw, "goodput\t%.2f req/s (%s)\n", rep.GoodputPerS, c.SLO)
	}
	fmt.Fprintf(tw, "\n\tmean\tp50\tp90\tp99\t(ms)\n")
	for _, row := range []struct {
		name string
		s    Summary
	}{{"TTFT", rep.TTFT}, {"ITL", rep.ITL}, {"TPOT", rep.TPOT}, {"E2E", rep.E2E}} {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t\n", row.name, row.s.Mean, row.s.P50, row.s.P90, row.s.P99)
	}
	failed := rep.Requests - rep.Completed
	fmt.Fprintf(tw, "\nerrors\t%d\n", failed)
	for _, k := range Kinds {
		if n := rep.Errors[k]; n > 0 {
			fmt.Fprintf(tw, "  %s\t%d\n", k, n)
		}
	}
	return tw.Flush()
}

// RawRecord is one line of the raw output, for plotting distributions.
// Times are in milliseconds; Start is the send time from the run's start.
type RawRecord struct {
	Index        int     `json:"index"`
	Warmup       bool    `json:"warmup,omitempty"`
	StartMS      float64 `json:"start_ms"`
	TTFTMS       float64 `json:"ttft_ms"`
	E2EMS        float64 `json:"e2e_ms"`
	OutputTokens int     `json:"output_tokens"`
	PromptTokens int     `json:"prompt_tokens"`
	// Route is the route a Switchyard broker chose (its
	// x-switchyard-route header: regular or pd); absent when the server
	// does not say.
	Route  string `json:"route,omitempty"`
	Error  string `json:"error,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func writeRaw(w io.Writer, recs []*record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, rec := range recs {
		rr := RawRecord{
			Index:        rec.index,
			Warmup:       rec.warmup,
			StartMS:      ms(float64(rec.start)),
			TTFTMS:       ms(float64(rec.ttft)),
			E2EMS:        ms(float64(rec.e2e)),
			OutputTokens: rec.outTokens,
			PromptTokens: rec.promptTokens,
			Route:        rec.route,
			Error:        string(rec.kind),
		}
		if rec.err != nil {
			rr.Detail = rec.err.Error()
		}
		if err := enc.Encode(rr); err != nil {
			return err
		}
	}
	return bw.Flush()
}
