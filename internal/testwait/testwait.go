package testwait

import (
	"testing"
	"time"
)

// For polls f every interval until it returns nil or total passes, then
// fails the test with f's last error. total is a bound for a broken state,
// not a figure the test measures: a busy machine only makes For poll
// longer.
func For(t testing.TB, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if !time.Now().Before(deadline) {
			break
		}
		time.Sleep(every)
	}
	t.Fatalf("condition not met after %s: %v", total, err)
}
