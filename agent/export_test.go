package agent

import "github.com/switchyard-ai/switchyard/wire"

// newStream returns an attempt's stream made alone (handle makes its own
// in its jobRun).
func newStream(a *Agent, job *wire.Job) *stream {
	s := new(stream)
	s.init(a, job)
	return s
}

// CancelRecorded reports whether the agent has taken in a cancel for
// request id: a test that sends a cancel before its job waits for this
// state instead of sleeping for it.
func (a *Agent) CancelRecorded(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.cancelled[id]
	return ok
}

// SlotsHeld is the jobs the agent holds against its pull limit.
func (a *Agent) SlotsHeld() int { return a.slots.held() }
