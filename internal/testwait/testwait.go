package testwait

import (
	"fmt"
	"io"
	"net/http"
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

// Status polls url with c (http.DefaultClient when nil) until it answers
// want: a server's readiness (/readyz, /health) is a state to wait for;
// its listening log line is only a sign that comes before it.
func Status(t testing.TB, c *http.Client, url string, want int) {
	t.Helper()
	if c == nil {
		c = http.DefaultClient
	}
	For(t, 30*time.Second, 10*time.Millisecond, func() error {
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("%s: %d %s, want %d", url, resp.StatusCode, body, want)
		}
		return nil
	})
}
