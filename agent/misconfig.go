package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/switchyard-ai/switchyard/wire"
)

// Re-probing an engine that refused the agent: the first probe after
// reprobeMin, then doubling up to reprobeMax, so a key fixed on the engine
// side is noticed within seconds without hammering an engine that stays
// misconfigured for hours.
const (
	reprobeMin = 200 * time.Millisecond
	reprobeMax = 5 * time.Second
	// heldBackDelay is how long a job pulled while the agent is out of
	// service waits before the queue offers it again (to another agent: this
	// one has stopped asking).
	heldBackDelay = 100 * time.Millisecond
)

// gate keeps the agent out of service while its engine refuses it (a wrong
// engine API key, an engine serving another model): the pull loop waits at
// it, and the heartbeat's state_reason says why.
type gate struct {
	mu   sync.Mutex
	shut chan struct{} // non-nil while out of service; closed when back
}

// serving reports whether the gate is open.
func (a *Agent) serving() bool {
	a.gate.mu.Lock()
	defer a.gate.mu.Unlock()
	return a.gate.shut == nil
}

// waitServing blocks the pull loop while the agent is out of service. It
// returns false if ctx ended first.
func (a *Agent) waitServing(ctx context.Context) bool {
	a.gate.mu.Lock()
	shut := a.gate.shut
	a.gate.mu.Unlock()
	if shut == nil {
		return true
	}
	select {
	case <-shut:
		return true
	case <-ctx.Done():
		return false
	}
}

// heldBack hands a job pulled while the agent is out of service back to
// the queue (a pull request already waiting at the server when the engine
// refused the agent may still deliver some) and reports whether it did.
func (a *Agent) heldBack(msg jobMessage) bool {
	if a.serving() {
		return false
	}
	_ = msg.NakWithDelay(heldBackDelay)
	return true
}

// healthReason is a warming agent's state_reason for a failed health
// probe: the engine's own word when it refused the agent.
func healthReason(err error) string {
	var we *wire.Error
	if errors.As(err, &we) && we.GetCode() == wire.CodeEngineMisconfigured {
		return we.GetMessage()
	}
	return "engine not healthy yet: " + err.Error()
}

// engineRefused takes the agent out of service when err says the engine
// refused the agent itself (wire.CodeEngineMisconfigured): the agent
// announces "warming" with the reason, stops pulling, and re-probes the
// engine until it accepts the agent again. The request that met the
// refusal fails with a retryable error, which the broker retries on
// another agent. Other errors are left alone.
func (a *Agent) engineRefused(err error) {
	var we *wire.Error
	if !errors.As(err, &we) || we.GetCode() != wire.CodeEngineMisconfigured {
		return
	}
	a.gate.mu.Lock()
	if a.gate.shut != nil {
		a.gate.mu.Unlock()
		a.swapState(wire.StateWarming, wire.StateWarming, we.GetMessage())
		return // already out, already probing
	}
	a.gate.shut = make(chan struct{})
	a.gate.mu.Unlock()
	a.swapState(wire.StateReady, wire.StateWarming, we.GetMessage())
	a.log.Error("engine refuses the agent: out of service until it accepts the agent again", "reason", we.GetMessage())
	go a.reprobe()
}

// reprobe asks the engine, with backoff, until it accepts the agent, then
// puts the agent back in service (ready, with a new ready-since: the slow
// start ramps it up again). It gives up when the agent drains.
func (a *Agent) reprobe() {
	hc, _ := a.engine.(HealthChecker)
	for delay := reprobeMin; ; delay = min(2*delay, reprobeMax) {
		time.Sleep(delay)
		if a.State() == wire.StateDraining {
			return
		}
		var err error
		if hc != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = hc.Health(ctx)
			cancel()
		} else if delay < reprobeMax {
			// An engine that cannot be probed is tried again with the
			// next request, after the longest wait.
			continue
		}
		if err == nil {
			break
		}
		reason := healthReason(err)
		if a.StateReason() != reason {
			a.log.Warn("engine still refuses the agent", "reason", reason)
			a.swapState(wire.StateWarming, wire.StateWarming, reason)
		}
	}
	a.gate.mu.Lock()
	close(a.gate.shut)
	a.gate.shut = nil
	a.gate.mu.Unlock()
	a.swapState(wire.StateWarming, wire.StateReady, "")
	a.log.Info("engine accepts the agent again: back in service")
}

// swapState moves the agent from state from to state to, for reason, only
// if it is still in from: a drain that began meanwhile wins.
func (a *Agent) swapState(from, to, reason string) {
	for {
		old := a.state.Load()
		if old.state != from {
			return
		}
		if old.state == to && old.reason == reason {
			return
		}
		if a.state.CompareAndSwap(old, &stateInfo{state: to, reason: reason}) {
			break
		}
	}
	if to == wire.StateReady && from != wire.StateReady {
		a.readySince.Store(time.Now().UnixNano())
	}
	a.poke()
}

// poke makes the heartbeat loop publish now.
func (a *Agent) poke() {
	select {
	case a.stateCh <- struct{}{}:
	default:
	}
}
