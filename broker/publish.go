package broker

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/natsx"
)

// DefaultPublishWait bounds how long a request waits for NATS to take its
// job (see Config.PublishWait): longer than a JetStream leader election
// (nats-server's election timeout is 4 to 9 s) plus a reconnect.
const DefaultPublishWait = 15 * time.Second

// Backoff between two tries of a publish that NATS could not take now.
const (
	publishBackoffMin = 25 * time.Millisecond
	publishBackoffMax = 500 * time.Millisecond
)

// jobMsgID is the JetStream message id of an attempt's job: a try whose
// answer was lost in a failover but whose job was stored is not stored
// again when the publish is tried again (the stream's duplicate window
// answers with the first one's sequence).
func jobMsgID(request string, attempt uint32) string {
	return request + "." + strconv.FormatUint(uint64(attempt), 10)
}

// publishJob stores an attempt's job, riding out a stream leader election
// and a reconnect (natsx.Publish) until the job is stored, ctx ends, or
// until passes. Each try is bounded by the publish timeout, so a try sent
// to a node that died is given up for the next. A full queue, or any
// other answer, ends it at once.
func (b *Broker) publishJob(ctx context.Context, subject string, data []byte, msgID string, until time.Time) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	ack, tries, err := natsx.Publish(ctx, b.js, subject, data, msgID, natsx.Retry{
		Try: b.publishTimeout, MinBackoff: publishBackoffMin, MaxBackoff: publishBackoffMax,
		Retrying: func(err error, backoff time.Duration) {
			b.metrics.publishRetries.Inc()
			b.log.Debug("job not published yet, retrying", "subject", subject, "msg_id", msgID, "err", err, "backoff", backoff)
		},
	})
	if err == nil && tries > 1 {
		b.log.Info("job published after a failover", "subject", subject, "msg_id", msgID, "tries", tries, "duplicate", ack.Duplicate)
	}
	if err != nil {
		b.noteWrite(err)
	}
	return ack, err
}

// awaitConnected waits until NATS is connected, ctx ends or until passes,
// and reports whether it is connected.
func (b *Broker) awaitConnected(ctx context.Context, until time.Time) bool {
	if !until.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}
	return natsx.AwaitConnected(ctx, b.nc)
}

// publishUntil is how long the current attempt's publish may wait: the
// bound set when the request arrived (its wait for NATS counts), or the
// publish wait from now for a retry or a migration; never past the
// request's deadline.
func (c *Call) publishUntil() time.Time {
	until := c.publishBy
	c.publishBy = time.Time{}
	if until.IsZero() {
		until = time.Now().Add(c.b.cfg.PublishWait)
	}
	if c.Deadline.Before(until) {
		until = c.Deadline
	}
	return until
}

// timers are reused by calls (see Call.Next): since Go 1.23 a stopped
// timer sends nothing stale, so a timer can go back to the pool once
// stopped.
var timers = sync.Pool{New: func() any { return time.NewTimer(time.Hour) }}

// publish stores the current attempt's job through JetStream and returns
// its stream sequence, with the attempt's message id (jobMsgID): a try
// whose answer was lost is tried again without storing the job twice.
func (c *Call) publish(ctx context.Context, subject string, data []byte, attempt uint32) (uint64, error) {
	ack, err := c.b.publishJob(ctx, subject, data, jobMsgID(c.ID, attempt), c.publishUntil())
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}
