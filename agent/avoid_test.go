package agent

import (
	"testing"
	"time"
)

// TestAvoidList: a later attempt of a request that failed here is declined
// avoidDeclines times, then taken; the failed attempt itself, other
// requests and old failures are never declined.
func TestAvoidList(t *testing.T) {
	var l avoidList
	now := time.Now()
	l.failedHere("r1", 1, now)
	if l.decline("r1", 1, now) {
		t.Fatal("the attempt that failed was declined")
	}
	if l.decline("r2", 2, now) {
		t.Fatal("another request was declined")
	}
	for i := range avoidDeclines {
		if !l.decline("r1", 2, now) {
			t.Fatalf("retry not declined at its %d-th delivery", i+1)
		}
	}
	if l.decline("r1", 2, now) {
		t.Fatal("retry declined past the bound: with no other agent it would never run")
	}
	l.failedHere("r3", 1, now)
	if l.decline("r3", 2, now.Add(avoidWindow+time.Second)) {
		t.Fatal("a failure older than the window still declines")
	}
}
