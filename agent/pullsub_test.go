package agent

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestPullStatus: the pull loop reads a pull's answers as nats.go's Fetch
// does: data is a job; a status message (header, no data) ends the pull,
// as a plain end (expired, nothing there), a consumer gone (consumerGone
// binds it again) or another failure; an idle heartbeat does not end it.
func TestPullStatus(t *testing.T) {
	st := func(code, desc string) *nats.Msg {
		return &nats.Msg{Header: nats.Header{"Status": {code}, "Description": {desc}}}
	}
	for _, c := range []struct {
		name string
		m    *nats.Msg
		want error
		gone bool
	}{
		{"job", &nats.Msg{Data: []byte("job")}, nil, false},
		{"job with headers", &nats.Msg{Data: []byte("job"), Header: nats.Header{"Nats-Msg-Id": {"x"}}}, nil, false},
		{"expired", st("408", "Request Timeout"), errPullEnded, false},
		{"no messages", st("404", "No Messages"), errPullEnded, false},
		{"heartbeat", st("100", "Idle Heartbeat"), errNotEnd, false},
		{"no responders", st("503", ""), nats.ErrNoResponders, true},
		{"consumer deleted", st("409", "Consumer Deleted"), jetstream.ErrConsumerDeleted, true},
		{"leadership change", st("409", "Leadership Change"), jetstream.ErrConsumerLeadershipChanged, false},
	} {
		got := status(c.m)
		if !errors.Is(got, c.want) || consumerGone(got) != c.gone {
			t.Errorf("%s: %v (consumer gone: %v), want %v (%v)", c.name, got, consumerGone(got), c.want, c.gone)
		}
	}
	if err := status(st("409", "Exceeded MaxWaiting")); err == nil || errors.Is(err, errPullEnded) || consumerGone(err) {
		t.Errorf("409 Exceeded MaxWaiting: %v, want a failure of its own", err)
	}
}

// TestRanHereForgets: attempts that ran are remembered for dupWindow after
// their end and then forgotten; running ones are not touched.
func TestRanHereForgets(t *testing.T) {
	a := &Agent{running: make(map[attemptKey]time.Time)}
	t0 := time.Now()
	a.running[attemptKey{"now", 0}] = time.Time{} // running
	a.ranHere(attemptKey{"req-1", 0}, t0)
	a.ranHere(attemptKey{"req-2", 0}, t0.Add(dupWindow/2))
	if len(a.running) != 3 {
		t.Fatalf("running %v", a.running)
	}
	a.ranHere(attemptKey{"req-3", 0}, t0.Add(dupWindow))
	if _, ok := a.running[attemptKey{"req-1", 0}]; ok || len(a.running) != 3 || len(a.ranOrder) != 2 {
		t.Fatalf("after dupWindow: running %v, order %v", a.running, a.ranOrder)
	}
	a.ranHere(attemptKey{"req-4", 0}, t0.Add(3*dupWindow))
	if _, ok := a.running[attemptKey{"now", 0}]; !ok || len(a.running) != 2 || len(a.ranOrder) != 1 {
		t.Fatalf("much later: running %v, order %v", a.running, a.ranOrder)
	}
}
