package agentcmd

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// PendingModel is the model an agent's heartbeats name while its engine
// has not yet said which model it serves (no --model: the agent asks the
// engine's /v1/models, which answers only once the weights are loaded). The
// agent then shows in the fleet view as pending, with why, instead of not
// at all while its engine loads for minutes; brokers keep it apart from
// every model (wire.ModelPending).
const PendingModel = wire.ModelPending

// pending announces an agent whose model is not known yet: warming
// heartbeats under PendingModel, and a last "stopped" one when the model is
// known, so brokers drop the entry at once.
type pending struct {
	nc   *nats.Conn
	subj string
	o    *options

	mu        sync.Mutex
	seq       uint32
	announced bool
	last      time.Time
	reason    string // the last warming reason; "" before the first
}

// why says what the agent waits for before it has an engine: its engine
// to name the model, or the engine to be set up.
func (p *pending) why() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reason != "" {
		return p.reason
	}
	return "starting: setting up the engine"
}

func newPending(nc *nats.Conn, o *options) (*pending, error) {
	b, err := subjects.New(o.prefix)
	if err != nil {
		return nil, err
	}
	subj, err := b.Heartbeat(PendingModel, o.role, o.id)
	if err != nil {
		return nil, err
	}
	return &pending{nc: nc, subj: subj, o: o}, nil
}

// warming publishes a warming heartbeat saying why, at most twice per
// heartbeat interval.
func (p *pending) warming(reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reason = reason
	if p.announced && time.Since(p.last) < p.o.heartbeat/2 {
		return
	}
	p.publish(wire.StateWarming, reason)
	p.announced, p.last = true, time.Now()
}

// wait waits d, or until ctx ends, heartbeating reason meanwhile so the
// entry never goes stale between two questions to the engine.
func (p *pending) wait(ctx context.Context, d time.Duration, reason string) error {
	t := time.NewTimer(d)
	defer t.Stop()
	tick := time.NewTicker(p.o.heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-tick.C:
			p.warming(reason)
		}
	}
}

// done takes the pending entry out of the brokers' tables, if it was ever
// announced.
func (p *pending) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reason = "engine named its model: starting"
	if p.announced {
		p.publish(wire.StateStopped, "engine named its model")
		p.announced = false
	}
}

func (p *pending) publish(state, reason string) {
	p.seq++
	hb := &wire.Heartbeat{
		AgentId: p.o.id, Model: PendingModel, Pool: p.o.role, Engine: p.o.engine,
		State: state, StateReason: reason, Slots: uint32(p.o.slots),
		Interval: durationpb.New(p.o.heartbeat), Seq: p.seq, SentAt: timestamppb.Now(),
	}
	if p.o.role != subjects.PoolRegular {
		hb.PdProtocol, hb.PdLabels = p.o.pdProto, p.o.pdLabels
	}
	data, err := wire.MarshalHeartbeat(hb)
	if err != nil {
		p.o.log.Error("heartbeat encode", "err", err)
		return
	}
	if err := p.nc.Publish(p.subj, data); err != nil {
		p.o.log.Warn("heartbeat publish failed", "err", err)
	}
}
