package broker

import (
	"errors"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Class is a request's work class. Interactive work comes first; batch work
// (the Batches API's lines) runs only on capacity interactive work is not
// using.
type Class uint8

const (
	// ClassInteractive is the zero value: a client waits for the answer.
	ClassInteractive Class = iota
	// ClassBatch is work nobody waits on token by token: agents take it
	// only with room interactive work leaves them.
	ClassBatch
)

// String is the class's name in metrics, logs and /v1/fleet.
func (c Class) String() string {
	switch c {
	case ClassInteractive:
		return "interactive"
	case ClassBatch:
		return "batch"
	}
	return "unknown"
}

// classSubject returns the queue an attempt of class c goes to: the
// pool's interactive queue (see Broker.jobsSubject), or its batch queue,
// which agents pull only with room interactive work leaves them.
func (b *Broker) classSubject(c Class, model, pool, pair string) (string, error) {
	if c != ClassBatch {
		return b.jobsSubject(model, pool, pair)
	}
	k := jobsKey{model, pool, pair}
	if s, ok := b.batchSubj.Load(k); ok {
		return s.(string), nil
	}
	s, err := b.subj.BatchJobs(model, pool, pair)
	if err != nil {
		return "", err
	}
	b.batchSubj.Store(k, s)
	return s, nil
}

// waitsInQueue reports whether an attempt may wait in its queue for as
// long as its deadline allows: a batch job waits by design for capacity
// interactive work leaves, so the queue timeout (a bound on how long a
// client waits for an agent) does not end it.
func (c *Call) waitsInQueue() bool { return c.req.Class == ClassBatch }

// batchDeadline returns the deadline a request of class c keeps: a batch
// line's is its batch's completion window, beyond the request timeout
// that bounds interactive requests.
func batchDeadline(c Class, asked, capped time.Time) time.Time {
	if c == ClassBatch && !asked.IsZero() {
		return asked
	}
	return capped
}

// preemptible reports whether an agent may stop the call's job for
// interactive work: a batch job whose stream can be continued elsewhere
// (see migrate). A job that cannot be continued runs to its end once it
// started.
func (c *Call) preemptible() bool {
	return c.req.Class == ClassBatch && c.req.NoMigration == "" && !c.reasoned
}

// preempted reports whether an attempt ended because its agent preempted
// it (wire.CodePreempted).
func preempted(why error) bool {
	return errors.Is(why, &wire.Error{Code: wire.CodePreempted})
}

// FormatClass is the class a request's own body asks for: batch for
// service_tier "flex", interactive otherwise (see oaiformat.ServiceTiers).
func FormatClass(p *oaiformat.Request) Class {
	if p != nil && p.Flex {
		return ClassBatch
	}
	return ClassInteractive
}

// BatchSlotShare is the share of a pool's slots its batch-class jobs hold.
func BatchSlotShare(ps dispatch.PoolStats) float64 {
	if ps.Slots <= 0 {
		return 0
	}
	return float64(ps.Batch) / float64(ps.Slots)
}
