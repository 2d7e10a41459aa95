//go:build !race

// Allocation counts, checked only without the race detector, which
// changes them.

package openaihttp

import (
	"github.com/switchyard-ai/switchyard/dispatch"
	"net/http"
	"reflect"
	"testing"
)

func (w *headerWriter) Header() http.Header         { return w.h }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(status int)      { w.status = status }

// TestStreamHeadAllocs: a stream's head (its SSE headers and its route)
// makes no allocation of its own: the values are made once.
func TestStreamHeadAllocs(t *testing.T) {
	w := &headerWriter{h: make(http.Header, 8)}
	allocs := testing.AllocsPerRun(100, func() {
		clear(w.h)
		setRoute(w.h, dispatch.RoutePD)
		h := sseHead{w: w}
		h.start()
	})
	if allocs != 0 {
		t.Fatalf("a stream's head: %.1f allocations, want 0", allocs)
	}
	want := http.Header{"Content-Type": {"text/event-stream"}, "Cache-Control": {"no-cache"}, "X-Accel-Buffering": {"no"}, "X-Switchyard-Route": {"pd"}}
	if !reflect.DeepEqual(w.h, want) || w.status != http.StatusOK {
		t.Fatalf("head %d %v, want 200 %v", w.status, w.h, want)
	}
	setRoute(w.h, dispatch.Route(7))
	if got := w.h.Get("X-Switchyard-Route"); got != "Route(7)" {
		t.Fatalf("an unknown route's header %q", got)
	}
}
