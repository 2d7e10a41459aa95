// Package promtext reads a Prometheus text exposition for the benchmark
// runner and the tests, through expfmt (the parser client_golang's own
// exposition is written for), so none of them scans metric lines by
// hand. The product reads engines' metrics with expfmt directly
// (agent/engine/openai.ParseLoad).
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxExposition bounds the bytes of an exposition Fetch reads.
const maxExposition = 16 << 20

// Metrics is an exposition's metric families by name, as the exposition
// names them (a counter's name ends in _total when its TYPE line's does).
type Metrics map[string]*dto.MetricFamily

// Parse reads a text exposition.
func Parse(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics text: %w", err)
	}
	return mf, nil
}

// ParseString is Parse of a string, for a body already read.
func ParseString(s string) (Metrics, error) { return Parse(strings.NewReader(s)) }

// Fetch reads the exposition at url (a /metrics endpoint) with c, nil for
// http.DefaultClient; an answer other than 200 is an error.
func Fetch(ctx context.Context, c *http.Client, url string) (Metrics, error) {
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return Parse(io.LimitReader(resp.Body, maxExposition))
}

// Sample is one series: its labels as the exposition writes them
// (a="x",b="y", sorted by name) and its value.
type Sample struct {
	Labels string
	Value  float64
}

// Samples is name's series whose labels hold every given name and value
// pair (labels alternates names and values), in the exposition's order.
func (m Metrics) Samples(name string, labels ...string) []Sample {
	mf := m[name]
	if mf == nil {
		return nil
	}
	var out []Sample
	for _, s := range mf.GetMetric() {
		if !matches(s, labels) {
			continue
		}
		var b strings.Builder
		for i, lp := range s.GetLabel() {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, "%s=%q", lp.GetName(), lp.GetValue())
		}
		out = append(out, Sample{Labels: b.String(), Value: value(s)})
	}
	return out
}

// Sum is the sum of name's series whose labels hold every given name and
// value pair (see Samples); 0 when there are none.
func (m Metrics) Sum(name string, labels ...string) float64 {
	sum := 0.0
	for _, s := range m.Samples(name, labels...) {
		sum += s.Value
	}
	return sum
}

// matches reports whether s carries every name and value pair of labels.
func matches(s *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range s.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// value is a series' value: a counter's, gauge's or untyped's; a
// histogram's or summary's sample count.
func value(s *dto.Metric) float64 {
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	case s.Histogram != nil:
		return float64(s.GetHistogram().GetSampleCount())
	case s.Summary != nil:
		return float64(s.GetSummary().GetSampleCount())
	}
	return 0
}
