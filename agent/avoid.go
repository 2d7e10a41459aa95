package agent

import (
	"strings"
	"sync"
	"time"
)

// A request whose attempt failed here with an error another engine may
// not meet (an engine that hung, stalled or broke) is retried (before its
// first token) or migrated (after it) by the broker on whichever agent
// pulls its next job first, and a hung engine's agent has free
// slots: without more, the retry often comes back here. So the agent
// remembers such requests for avoidWindow and hands a later attempt of one
// back to the queue, after avoidDelay, up to avoidDeclines times, for
// another agent to take. Past that nobody else took it (the agent is
// alone, or the others are full), and it runs here: a retry is never lost
// to the exclusion, only delayed by it.
//
// The agent alone knows its engine failed the request, so this needs no
// field in the job and no help from the broker, whose directed offers
// already skip the agents of a call's earlier attempts.
const (
	avoidWindow   = time.Minute
	avoidDelay    = 50 * time.Millisecond
	avoidDeclines = 3
	// avoidMax bounds the requests remembered; past it the memory starts
	// again (it is a preference, not a guarantee).
	avoidMax = 4096
)

// avoidList is the requests an agent's engine failed recently, with the
// attempt that failed and the later attempts declined.
type avoidList struct {
	mu   sync.Mutex
	reqs map[string]avoided
}

type avoided struct {
	at       time.Time
	attempt  uint32 // the attempt that failed here
	declined int
}

// failedHere records that attempt of request failed here with an error
// the broker runs it again for.
func (l *avoidList) failedHere(request string, attempt uint32, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reqs == nil || len(l.reqs) >= avoidMax {
		l.reqs = make(map[string]avoided)
	}
	l.reqs[strings.Clone(request)] = avoided{at: now, attempt: attempt}
}

// decline reports whether a job of attempt of request should go back to
// the queue for another agent, and counts it.
func (l *avoidList) decline(request string, attempt uint32, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.reqs[request]
	switch {
	case !ok:
		return false
	case now.Sub(v.at) > avoidWindow:
		delete(l.reqs, request)
		return false
	case attempt <= v.attempt || v.declined >= avoidDeclines:
		return false
	}
	v.declined++
	l.reqs[request] = v
	return true
}

// avoided hands run's job, a later attempt of a request that failed here,
// back to the queue (see avoidList) and reports whether it did.
func (a *Agent) avoided(run *jobRun) bool {
	if !a.avoid.decline(run.key.request, run.key.attempt, time.Now()) {
		return false
	}
	a.log.Debug("retry of a request that failed here handed back for another agent", "request", run.key.request, "attempt", run.key.attempt)
	_ = run.msg.NakWithDelay(avoidDelay)
	return true
}
