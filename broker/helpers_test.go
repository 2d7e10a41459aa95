package broker

import (
	"testing"
	"time"
)

// checkFor polls f every interval until it returns nil, failing the test
// with f's last error after total.
func checkFor(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(every)
	}
}
