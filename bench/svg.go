package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// series is one curve: sorted values in milliseconds.
type series struct {
	name   string
	values []float64
}

var palette = []string{"#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02"}

// writeCDF draws the empirical CDF of each series as an SVG line chart,
// with a linear or logarithmic millisecond axis.
func writeCDF(path, title string, ss []series, logX bool) error {
	const w, h, left, right, top, bottom = 760, 440, 70, 190, 40, 55
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		if len(s.values) == 0 {
			continue
		}
		lo = min(lo, s.values[0])
		// Cut the axis at the 99.9th percentile of the widest series so a
		// handful of outliers do not squash the curves.
		hi = max(hi, percentile(s.values, 99.9))
	}
	if math.IsInf(lo, 0) {
		return fmt.Errorf("%s: no data", title)
	}
	var ticks []float64
	var xf func(float64) float64
	if logX {
		lo = math.Pow(10, math.Floor(math.Log10(max(lo, 1e-3))))
		hi = math.Pow(10, math.Ceil(math.Log10(hi)))
		for t := lo; t <= hi*1.0001; t *= 10 {
			ticks = append(ticks, t)
		}
		xf = func(v float64) float64 {
			v = min(max(v, lo), hi)
			return left + pw*(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo))
		}
	} else {
		lo = 0
		step := niceStep(hi / 6)
		hi = math.Ceil(hi/step) * step
		for t := 0.0; t <= hi*1.0001; t += step {
			ticks = append(ticks, t)
		}
		xf = func(v float64) float64 { return left + pw*min(v, hi)/hi }
	}
	yf := func(p float64) float64 { return top + ph*(1-p) }

	var b strings.Builder
	svgStart(&b, w, h, left, title)
	for _, t := range ticks {
		x := xf(t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, h-bottom+16, tickLabel(t))
	}
	for _, p := range []float64{0, 0.25, 0.5, 0.75, 0.9, 0.99, 1} {
		y := yf(p)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%g</text>`+"\n", left-6, y, p)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">TTFT (ms%s)</text>`+"\n", left+pw/2, h-12, map[bool]string{true: ", log scale", false: ""}[logX])
	fmt.Fprintf(&b, `<text x="16" y="%.0f" text-anchor="middle" transform="rotate(-90 16 %.0f)">fraction of requests</text>`+"\n", top+ph/2, top+ph/2)
	for i, s := range ss {
		if len(s.values) == 0 {
			continue
		}
		color := palette[i%len(palette)]
		var pts strings.Builder
		n := len(s.values)
		// At most ~600 points per curve: the SVG stays small.
		stride := max(1, n/600)
		prevX := xf(s.values[0])
		fmt.Fprintf(&pts, "%.1f,%.1f ", prevX, yf(0))
		for j := 0; j < n; j += stride {
			x := xf(s.values[j])
			fmt.Fprintf(&pts, "%.1f,%.1f %.1f,%.1f ", x, yf(float64(j)/float64(n)), x, yf(float64(j+1)/float64(n)))
		}
		fmt.Fprintf(&pts, "%.1f,%.1f", xf(s.values[n-1]), yf(1))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, pts.String())
		legend(&b, w-right, top+14+20*i, color, s.name)
	}
	return svgEnd(path, &b)
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func tickLabel(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gk", v/1000)
	default:
		return fmt.Sprintf("%g", math.Round(v*1000)/1000)
	}
}

// percentile of sorted values (linear interpolation, as numpy).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (rank-float64(lo))*(sorted[hi]-sorted[lo])
}

// curve is one line of a line chart, its points in x order.
type curve struct {
	name string
	x, y []float64
}

// lineChart is an SVG line chart with markers at the points. When labels
// is set, x is the index of a category and the axis names them; guide,
// when positive, draws a dashed horizontal line at that y.
type lineChart struct {
	title, xLabel, yLabel string
	labels                []string
	yMax, guide           float64
}

func (c lineChart) write(path string, cs []curve) error {
	const w, h, left, right, top, bottom = 760, 440, 70, 150, 40, 55
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	xHi, yHi := 0.0, c.yMax
	for _, cv := range cs {
		for i := range cv.x {
			xHi, yHi = max(xHi, cv.x[i]), max(yHi, cv.y[i])
		}
	}
	if len(c.labels) > 0 {
		xHi = float64(len(c.labels) - 1)
	}
	if xHi == 0 || yHi == 0 {
		return fmt.Errorf("%s: no data", c.title)
	}
	yStep := niceStep(yHi / 6)
	yHi = math.Ceil(yHi/yStep) * yStep
	xf := func(v float64) float64 { return left + pw*v/xHi }
	yf := func(v float64) float64 { return top + ph*(1-v/yHi) }
	var b strings.Builder
	svgStart(&b, w, h, left, c.title)
	tick := func(v float64, label string) {
		x := xf(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, h-bottom+16, html.EscapeString(label))
	}
	if len(c.labels) > 0 {
		for i, l := range c.labels {
			tick(float64(i), l)
		}
	} else {
		step := niceStep(xHi / 8)
		for t := 0.0; t <= xHi*1.0001; t += step {
			tick(t, tickLabel(t))
		}
	}
	for t := 0.0; t <= yHi*1.0001; t += yStep {
		y := yf(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", left-6, y, tickLabel(t))
	}
	if c.guide > 0 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#888" stroke-dasharray="6 4"/>`+"\n", left, yf(c.guide), w-right, yf(c.guide))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`+"\n", left+pw/2, h-12, html.EscapeString(c.xLabel))
	fmt.Fprintf(&b, `<text x="16" y="%.0f" text-anchor="middle" transform="rotate(-90 16 %.0f)">%s</text>`+"\n", top+ph/2, top+ph/2, html.EscapeString(c.yLabel))
	for i, cv := range cs {
		color := palette[i%len(palette)]
		var pts strings.Builder
		for j := range cv.x {
			fmt.Fprintf(&pts, "%.1f,%.1f ", xf(cv.x[j]), yf(cv.y[j]))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`+"\n", xf(cv.x[j]), yf(cv.y[j]), color)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.TrimSpace(pts.String()))
		legend(&b, w-right, top+14+20*i, color, cv.name)
	}
	return svgEnd(path, &b)
}

// svgStart opens a w×h chart on a white ground with its title.
func svgStart(b *strings.Builder, w, h, left int, title string) {
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
}

// legend draws one series' key at the right of the plot area (x), at y.
func legend(b *strings.Builder, x, y int, color, name string) {
	fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", x+12, y, x+32, y, color)
	fmt.Fprintf(b, `<text x="%d" y="%d" dominant-baseline="middle">%s</text>`+"\n", x+38, y, html.EscapeString(name))
}

// svgEnd closes the chart and writes it to path, making its directory.
func svgEnd(path string, b *strings.Builder) error {
	b.WriteString("</svg>\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// budgetBar is one budgeted figure: Switchyard's value and its peer's,
// and the budget as a multiple of the peer's, an upper bound (CPU) or,
// when atLeast, a lower one (tokens/s).
type budgetBar struct {
	name, peer   string
	ours, theirs float64
	budget       float64
	atLeast      bool
}

// met reports whether the figure is within its budget.
func (r budgetBar) met() bool {
	if r.atLeast {
		return r.ours >= r.budget*r.theirs
	}
	return r.ours <= r.budget*r.theirs
}

// writeBudget draws each budgeted figure as Switchyard's bar beside its
// peer's (gray), both as multiples of the peer's value (the peer at 1),
// with the budget a dashed line across the pair: a green bar is within
// it, an orange one outside. A \n in a figure's name breaks its label.
func writeBudget(path, title string, bars []budgetBar) error {
	const w, h, left, right, top, bottom = 760, 440, 70, 20, 40, 85
	pw, ph := float64(w-left-right), float64(h-top-bottom)
	if len(bars) == 0 {
		return fmt.Errorf("%s: no data", title)
	}
	yHi := 1.0
	for _, r := range bars {
		if r.theirs <= 0 {
			return fmt.Errorf("%s: %s: no peer's value", title, r.name)
		}
		yHi = max(yHi, r.ours/r.theirs, r.budget)
	}
	yStep := niceStep(yHi / 6)
	yHi = math.Ceil(yHi*1.05/yStep) * yStep
	yf := func(v float64) float64 { return top + ph*(1-v/yHi) }
	var b strings.Builder
	svgStart(&b, w, h, left, title)
	for t := 0.0; t <= yHi*1.0001; t += yStep {
		y := yf(t)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, w-right, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%sx</text>`+"\n", left-6, y, tickLabel(t))
	}
	fmt.Fprintf(&b, `<text x="16" y="%.0f" text-anchor="middle" transform="rotate(-90 16 %.0f)">%s</text>`+"\n", top+ph/2, top+ph/2, "multiple of the peer's figure")
	slot := pw / float64(len(bars))
	bw := slot / 4
	for i, r := range bars {
		x0 := float64(left) + slot*float64(i)
		ours, color := r.ours/r.theirs, "#1b9e77"
		if !r.met() {
			color = "#d95f02"
		}
		bar := func(x, v float64, fill, label string) {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, yf(v), bw, yf(0)-yf(v), fill)
			// Inside the bar's top, clear of the budget's line above it.
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="white" font-weight="bold">%s</text>`+"\n", x+bw/2, yf(v)+16, html.EscapeString(label))
		}
		bar(x0+slot/2-bw-2, ours, color, fmt.Sprintf("%.2fx", ours))
		bar(x0+slot/2+2, 1, "#bbb", "1x")
		by := yf(r.budget)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n", x0+slot/2-bw-10, by, x0+slot/2+bw+10, by)
		cmp := "≤"
		if r.atLeast {
			cmp = "≥"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="start" font-size="11">%s %gx</text>`+"\n", x0+slot/2+bw+12, by+4, cmp, r.budget)
		for j, line := range append(strings.Split(r.name, "\n"), "against "+r.peer) {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x0+slot/2, h-bottom+18+16*j, html.EscapeString(line))
		}
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	return svgEnd(path, &b)
}
