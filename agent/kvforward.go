package agent

import (
	"context"
	"log/slog"

	"github.com/switchyard-ai/switchyard/kvevents"
)

// forwardKV subscribes to the engine's KV-cache events (Config.KVEvents)
// and publishes each batch's summary on the agent's KV subject, where
// every broker applies it to its prefix tree: the precise source of
// prefix-cache affinity. It returns when ctx ends. The events must carry
// the broker's block keys as hashes (sim-engine does; see
// docs/affinity.md for real vLLM).
func (a *Agent) forwardKV(ctx context.Context) {
	subj, err := a.subj.KV(a.cfg.Model, a.cfg.Pool, a.cfg.ID)
	if err != nil {
		a.log.Error("kv events: no subject", "err", err)
		return
	}
	sub := kvevents.NewSubscriber(a.cfg.KVEvents, a.cfg.KVEventsTopic, kvevents.WithLogger(a.log))
	a.log.Info("forwarding engine KV events", "endpoint", a.cfg.KVEvents, "subject", subj)
	_ = sub.Run(ctx, func(u kvevents.Update) {
		data, err := kvevents.ForwardOf(u).Marshal()
		if err != nil {
			return
		}
		if err := a.nc.Publish(subj, data); err != nil && a.log.Enabled(ctx, slog.LevelDebug) {
			a.log.Debug("kv events not forwarded", "err", err)
		}
	})
}
