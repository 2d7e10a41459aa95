package testwait

import (
	"errors"
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
