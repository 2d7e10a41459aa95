package agent

import "github.com/switchyard-ai/switchyard/wire"

// publishGoodbye sends the agent's last heartbeat as it exits, after its
// drain: state "stopped", nothing held, so brokers drop it from their
// capacity table at once instead of showing it stale for minutes.
func (a *Agent) publishGoodbye() {
	hb := a.Heartbeat()
	hb.State, hb.StateReason, hb.PullLimit = wire.StateStopped, "stopped", 0
	data, err := wire.MarshalHeartbeat(hb)
	if err != nil {
		a.log.Error("heartbeat encode", "err", err)
		return
	}
	if err := a.nc.Publish(a.hbSubj, data); err != nil {
		a.metrics.hbErrors.Inc()
		a.log.Warn("last heartbeat publish failed", "err", err)
	}
}
