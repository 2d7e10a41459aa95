package dispatch_test

import (
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
)

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

// FleetOf of the models NewFleet would build is the same fleet: the same
// snapshots by name, and the same list of models with eligible agents.
func TestFleetOf(t *testing.T) {
	cfg := dispatch.DefaultConfig()
	stale := pools(1, 0, 0, 8)
	stale[0].LastSeen = t0.Add(-time.Hour)
	agents := map[string][]dispatch.Agent{"b": pools(2, 1, 1, 8), "a": pools(1, 0, 0, 4), "gone": stale}
	want := dispatch.NewFleet(agents, t0, cfg)
	var models []*dispatch.Model
	for name, as := range agents {
		models = append(models, dispatch.NewModel(name, as, t0, cfg))
	}
	got := dispatch.FleetOf(models)
	if g, w := got.Models(), want.Models(); !slices.Equal(g, w) || len(g) != 2 {
		t.Fatalf("Models() = %v, want %v", g, w)
	}
	if g, w := got.AllModels(), want.AllModels(); !slices.Equal(g, w) {
		t.Fatalf("AllModels() = %v, want %v", g, w)
	}
	for _, name := range want.AllModels() {
		g, _ := got.Model(name)
		w, _ := want.Model(name)
		if !reflect.DeepEqual(g.Pools(), w.Pools()) {
			t.Errorf("%s: pools %+v, want %+v", name, g.Pools(), w.Pools())
		}
	}
	if dispatch.Fresh(stale[0], t0, cfg) || !dispatch.Fresh(agents["a"][0], t0, cfg) {
		t.Error("Fresh disagrees with the snapshot's staleness")
	}
}
