package agent

import "github.com/switchyard-ai/switchyard/wire"

// publishGoodbye sends the agent's last heartbeat as it exits, after its
// drain: state "stopped", nothing held, so brokers drop it from their
// capacity table at once instead of showing it stale for minutes.
func (a *Agent) publishGoodbye() {
	hb := a.Heartbeat()
	hb.State, hb.StateReason, hb.PullLimit = wire.StateStopped, "stopped", 0
	a.sendHeartbeat(hb, "last heartbeat publish failed")
}
