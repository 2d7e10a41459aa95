package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWriteSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "batch.md")
	steps := []struct{ before, want string }{
		{"", "## Benchmark\nfirst\n"},
		{"# Batch\n\n## API\ntext\n", "# Batch\n\n## API\ntext\n\n## Benchmark\nfirst\n"},
		{"# Batch\n\n## Benchmark\nold\nrows\n\n## Later\nkept\n", "# Batch\n\n## Benchmark\nfirst\n\n## Later\nkept\n"},
		{"## Benchmark\nold\n", "## Benchmark\nfirst\n"},
		{"# Batch\n\n### Figures of something\nkept\n", "# Batch\n\n### Figures of something\nkept\n\n## Benchmark\nfirst\n"},
	}
	for _, s := range steps {
		if s.before != "" {
			if err := os.WriteFile(path, []byte(s.before), 0o644); err != nil {
				t.Fatal(err)
			}
		} else {
			_ = os.Remove(path)
		}
		if err := writeSection(path, "## Benchmark", "## Benchmark\nfirst\n\n"); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(path)
		if string(got) != s.want {
			t.Errorf("from %q:\ngot  %q\nwant %q", s.before, got, s.want)
		}
	}
}

func TestIdleShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	samples := []slotSample{
		{at(0), 32, 0, 0},
		{at(1), 32, 16, 12}, // 16 idle, 12 batch
		{at(2), 32, 0, 32},  // 32 idle, 32 batch
		{at(3), 32, 32, 0},  // none idle
		{at(4), 32, 8, 24},  // outside the window below
	}
	share, idle, batch := idleShare(samples, at(1), at(3))
	if idle != 48 || batch != 44 || math.Abs(share-44.0/48) > 1e-9 {
		t.Errorf("share %v idle %v batch %v; want 44/48, 48, 44", share, idle, batch)
	}
	if _, idle, _ := idleShare(samples, time.Time{}, time.Time{}); idle != 72 {
		t.Errorf("whole run idle %v, want 72", idle)
	}
}

func TestInteractiveStats(t *testing.T) {
	var s []interactiveSample
	for i := range 100 {
		s = append(s, interactiveSample{ttft: time.Duration(i+1) * time.Millisecond, tpot: 10 * time.Millisecond, burst: i >= 50})
	}
	s = append(s, interactiveSample{failed: true, ttft: time.Hour})
	st := interactiveStats(s)
	if st.n != 101 || st.failed != 1 || st.ttft50 != 50500*time.Microsecond || st.tpot95 != 10*time.Millisecond || st.burstTTFT95 < 95*time.Millisecond {
		t.Errorf("%+v", st)
	}
}
