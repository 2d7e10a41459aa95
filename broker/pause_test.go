package broker

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

func TestPauseWatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	p := newPauseWatch(func() time.Time { return now })
	for range 50 { // a second of looks on time: no pause
		now = now.Add(pauseTick)
		p.look()
	}
	if d, _ := p.since(t0); d != 0 {
		t.Fatalf("pause %s while the watch looked on time", d)
	}
	before := now
	now = now.Add(2 * time.Second) // nobody looked for 2s
	d, at := p.since(t0)
	if want := 2*time.Second - pauseTick; d != want || !at.Equal(now) {
		t.Fatalf("pause %s at %s, want %s at %s", d, at, want, now)
	}
	// Only the part of a pause after t counts.
	if d, _ := p.since(before.Add(time.Second)); d != time.Second {
		t.Fatalf("pause after the middle of it: %s, want 1s", d)
	}
	if d, _ := p.since(now); d != 0 {
		t.Fatalf("pause after its end: %s", d)
	}
	// The ring keeps the latest pauses only, and bounds the memory.
	for range 2 * len(p.pauses) {
		now = now.Add(time.Second)
		p.look()
	}
	if d, _ := p.since(t0); d != time.Duration(len(p.pauses))*(time.Second-pauseTick) {
		t.Fatalf("pauses after %d of them: %s", 2*len(p.pauses), d)
	}
}

// The time the broker itself stood still does not count as its agents'
// silence: an agent heard just before a pause is still eligible after it,
// and one that stays silent while the broker runs goes stale as before.
func TestPauseIsNotAgentsSilence(t *testing.T) {
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	b, err := New(nc, Config{HeartbeatInterval: 100 * time.Millisecond, Dispatch: dispatch.Config{MissedHeartbeats: 3}},
		WithClock(clock), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	subj, _ := subjects.Must(subjects.DefaultPrefix).Heartbeat(testModel, subjects.PoolRegular, "a1")
	data, _ := wire.MarshalHeartbeat(&wire.Heartbeat{AgentId: "a1", Model: testModel, Pool: subjects.PoolRegular,
		State: wire.StateReady, Slots: 4, Interval: durationpb.New(100 * time.Millisecond)})
	b.onHeartbeat(&nats.Msg{Subject: subj, Data: data})
	eligible := func() bool {
		b.rebuild()
		m, ok := b.table.Load().Model(testModel)
		return ok && m.Eligible(dispatch.RouteRegular)
	}
	if !eligible() {
		t.Fatal("a1 not eligible after its heartbeat")
	}
	now = now.Add(2 * time.Second) // the broker stood still for 2s
	if !eligible() {
		t.Fatal("a1 stale after the broker's own pause")
	}
	for range 4 { // 400ms of the broker running, rebuilding on time, a1 silent
		now = now.Add(rebuildEvery / 2)
		eligible()
	}
	if eligible() {
		t.Fatal("a1 still eligible after 400ms of silence while the broker ran (3 heartbeats of 100ms missed)")
	}
}
