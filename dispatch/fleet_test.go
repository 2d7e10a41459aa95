package dispatch_test

import (
	"sync"
	"testing"

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
