package testwait

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	tests := []struct {
		name  string
		after int // f succeeds on this call
		calls int // calls expected
	}{
		{"at once", 1, 1},
		{"after polling", 4, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			For(t, time.Minute, time.Millisecond, func() error {
				n++
				if n < tc.after {
					return errors.New("not yet")
				}
				return nil
			})
			if n != tc.calls {
				t.Fatalf("%d calls, want %d", n, tc.calls)
			}
		})
	}
}

func TestStatus(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) < 3 {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	Status(t, nil, srv.URL, http.StatusOK)
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d calls, want 3", n)
	}
}
