package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// An agent whose heartbeat says stopped leaves the capacity table at
// once, not as a stale entry minutes later; its model stays known.
func TestStoppedAgentLeavesTable(t *testing.T) {
	r := newRig(t, Config{})
	idle := func(*fakeAgent, *wire.Job, func(*wire.Chunk)) {}
	bye := r.agent("bye", subjects.PoolRegular, "", 1, idle)
	r.agent("stay", subjects.PoolRegular, "", 1, idle)
	r.waitEligible("bye", "stay")
	bye.state.Store(wire.StateStopped)
	testwait.For(t, 5*time.Second, 10*time.Millisecond, func() error {
		m, _ := r.b.Fleet().Model(testModel)
		for _, v := range m.Agents() {
			if v.ID == "bye" {
				return fmt.Errorf("bye still in the table: %+v", v)
			}
		}
		for _, hb := range r.b.Heartbeats() {
			if hb.GetAgentId() == "bye" {
				return fmt.Errorf("bye's heartbeat still kept")
			}
		}
		return nil
	})
	if m, _ := r.b.Fleet().Model(testModel); len(m.Agents()) != 1 || !r.b.knownModel(testModel) {
		t.Fatalf("agents %+v, known %v: want stay alone, model known", m.Agents(), r.b.knownModel(testModel))
	}
}
