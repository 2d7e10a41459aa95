package broker

import (
	"slices"
	"strings"
	"time"

	"github.com/switchyard-ai/switchyard/wire"
)

// PendingAgent is an agent whose engine has not yet said which model it
// serves (wire.ModelPending): listed apart, never in a model's capacity,
// requests or metrics.
type PendingAgent struct {
	ID            string        `json:"id"`
	Pool          string        `json:"pool"`
	Engine        string        `json:"engine,omitempty"`
	Slots         int           `json:"slots"`
	StateReason   string        `json:"state_reason,omitempty"`
	LastHeartbeat time.Time     `json:"last_heartbeat"`
	Interval      time.Duration `json:"-"`
}

// notePending records the heartbeat of a pending agent; its last one
// (stopped, sent once its engine named the model, or as it exits) takes it
// off the list.
func (b *Broker) notePending(id, pool string, hb *wire.Heartbeat) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if hb.GetState() == wire.StateStopped {
		delete(b.pending, id)
		return
	}
	b.pending[id] = PendingAgent{
		ID: id, Pool: pool, Engine: hb.GetEngine(), Slots: int(hb.GetSlots()), StateReason: hb.GetStateReason(),
		LastHeartbeat: b.now().UTC(), Interval: hb.GetInterval().AsDuration(),
	}
}

// Pending returns the agents whose engines have not named their model yet,
// by id.
func (b *Broker) Pending() []PendingAgent {
	b.mu.Lock()
	out := make([]PendingAgent, 0, len(b.pending))
	for _, p := range b.pending {
		out = append(out, p)
	}
	b.mu.Unlock()
	slices.SortFunc(out, func(x, y PendingAgent) int { return strings.Compare(x.ID, y.ID) })
	return out
}
