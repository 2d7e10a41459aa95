package dispatch_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

func TestFleet(t *testing.T) {
	stale := ready("old", dispatch.PoolRegular, 8, 0)
	stale.LastSeen = t0.Add(-time.Minute)
	R, P, D := dispatch.PoolRegular, dispatch.PoolPrefill, dispatch.PoolDecode
	f := dispatch.NewFleet(map[string][]dispatch.Agent{
		"zeta/b":   pools(1, 0, 0, 8),
		"alpha/a":  pools(0, 1, 1, 8), // PD only
		"prefill":  pools(0, 1, 0, 8), // no partner: nothing to serve with
		"mismatch": {ready("p", P, 8, 0), sglang(ready("d", D, 8, 0))},
		"loading":  {warming(ready("r", R, 8, 0)), warming(ready("p", P, 8, 0)), warming(ready("d", D, 8, 0))},
		"gone":     {stale},
		"empty":    nil,
	}, t0, dispatch.DefaultConfig())

	if got, want := f.Models(), []string{"alpha/a", "zeta/b"}; !slices.Equal(got, want) {
		t.Errorf("Models() = %v, want %v", got, want)
	}
	if got, want := f.AllModels(), []string{"alpha/a", "empty", "gone", "loading", "mismatch", "prefill", "zeta/b"}; !slices.Equal(got, want) {
		t.Errorf("AllModels() = %v, want %v", got, want)
	}
	f.Models()[0] = "mutated"
	if f.Models()[0] != "alpha/a" {
		t.Error("Models() exposes the fleet's slice")
	}

	tests := []struct {
		name    string
		model   string
		found   bool
		regular bool
	}{
		{name: "regular model", model: "zeta/b", found: true, regular: true},
		{name: "stale model is kept for its error", model: "gone", found: true},
		{name: "loading model is kept for its view", model: "loading", found: true},
		{name: "unknown model", model: "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := f.Model(tt.model)
			if ok != tt.found || (ok && m.Eligible(dispatch.RouteRegular) != tt.regular) {
				t.Errorf("Model(%q) = %v, %v", tt.model, m, ok)
			}
		})
	}
	if allocs := testing.AllocsPerRun(100, func() { f.Model("zeta/b") }); allocs != 0 {
		t.Errorf("Fleet.Model allocates %v times", allocs)
	}
}

func TestTable(t *testing.T) {
	var tab dispatch.Table
	if f := tab.Load(); f != nil {
		t.Fatalf("zero Table Load() = %v, want nil", f)
	}
	if m, ok := tab.Load().Model("m"); ok || m != nil {
		t.Fatal("nil Fleet has a model")
	}
	if tab.Load().Models() != nil {
		t.Fatal("nil Fleet lists models")
	}

	// One writer swaps snapshots while readers decide; run with -race.
	tab.Store(dispatch.NewFleet(map[string][]dispatch.Agent{"m": pools(2, 1, 1, 8)}, t0, dispatch.DefaultConfig()))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 4 {
		wg.Go(func() {
			r := uint64(i)
			for {
				select {
				case <-stop:
					return
				default:
				}
				m, ok := tab.Load().Model("m")
				if !ok {
					t.Error("model vanished")
					return
				}
				r += 0x9e3779b97f4a7c15
				if _, err := m.Decide(dispatch.Need{}, nil, r); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for i := range 200 {
		tab.Store(dispatch.NewFleet(map[string][]dispatch.Agent{"m": pools(2+i%3, 1, 1, 8)}, t0, dispatch.DefaultConfig()))
	}
	close(stop)
	wg.Wait()
}
