package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/dispatch"
)

// How an attempt starts, for logs and metrics.
type startKind uint8

const (
	firstAttempt     startKind = iota // the request's first dispatch
	retryAttempt                      // before the first token: run it again elsewhere
	migrationAttempt                  // after it: continue the stream elsewhere
)

// startAttempt is the one path that starts an attempt: the first, a retry
// or a migration (whose body and continuation the caller has set). A later
// attempt abandons the current one first (see abandon). Then it routes the
// attempt and publishes its job.
func (c *Call) startAttempt(ctx context.Context, kind startKind, why error) error {
	if kind != firstAttempt {
		old := c.abandon()
		switch kind {
		case retryAttempt:
			c.retries++
			c.b.metrics.retries.WithLabelValues(retryReason(why)).Inc()
			c.b.log.Info("retrying request", "request", c.ID, "attempt", old+1, "reason", why)
		case migrationAttempt:
			c.migrations++
			c.b.metrics.migrations.Inc()
			c.b.log.Info("migrating request", "request", c.ID, "attempt", old+1, "tokens_sent", c.tokens, "reason", why)
		}
	}
	err := c.dispatch(ctx)
	if kind == firstAttempt || !errors.Is(err, ErrNoCapacity) {
		return err
	}
	// A retry or a migration that finds no agent serving now may be in a
	// NATS failover: the broker renewing its subscriptions, agents on the
	// lost node reconnecting, heartbeats missed meanwhile. The request was
	// accepted; wait for an agent within the publish wait instead of
	// giving it up.
	until := time.Now().Add(c.b.cfg.PublishWait)
	if c.Deadline.Before(until) {
		until = c.Deadline
	}
	poll := time.NewTicker(c.b.cfg.WatchInterval)
	defer poll.Stop()
	for errors.Is(err, ErrNoCapacity) && time.Now().Before(until) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-poll.C:
		}
		err = c.dispatch(ctx)
	}
	return err
}

// startFirst starts the first attempt. A known model that no agent serves
// right now (its agents warming, draining or gone) is refused at once, or,
// with CapacityWait, once no agent became ready within it: the job is
// never published to a queue nobody pulls.
func (c *Call) startFirst(ctx context.Context) error {
	err := c.startAttempt(ctx, firstAttempt, nil)
	if !errors.Is(err, ErrNoCapacity) {
		return err
	}
	wait := c.b.cfg.CapacityWait
	if wait < c.b.cfg.PublishWait && c.b.inFailover() && c.b.agentsStale(c.Model) {
		// Agents that were serving missed their heartbeats just after the
		// broker lost its connection (or was paused): that is the
		// broker's loss, not theirs, or they are reconnecting to another
		// node too. Wait for them as for a publish.
		wait = c.b.cfg.PublishWait
	}
	if wait <= 0 {
		return err
	}
	// While it waits, the request is in no queue: it is counted apart, so
	// that a scaler sees it (CapacityWaiting).
	pools := c.waitPools()
	c.b.waits.add(c.Model, pools, 1)
	defer c.b.waits.add(c.Model, pools, -1)
	give := time.NewTimer(min(wait, time.Until(c.Deadline)))
	defer give.Stop()
	poll := time.NewTicker(c.b.cfg.WatchInterval)
	defer poll.Stop()
	for errors.Is(err, ErrNoCapacity) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-give.C:
			return fmt.Errorf("%w (waited %s)", err, wait)
		case <-poll.C:
		}
		if m, ok := c.b.table.Load().Model(c.Model); ok && (m.Eligible(dispatch.RouteRegular) || m.Eligible(dispatch.RoutePD)) {
			c.publishBy = time.Time{} // the publish wait starts now
			err = c.startAttempt(ctx, firstAttempt, nil)
		}
	}
	return err
}

// inFailover reports whether the broker's connection came back, or the
// broker was found paused, within the publish wait.
func (b *Broker) inFailover() bool {
	at := b.reconnected.Load()
	return at != 0 && b.now().Sub(time.Unix(0, at)) < b.cfg.PublishWait
}

// agentsStale reports whether model has agents that missed their
// heartbeats (and are still in the table).
func (b *Broker) agentsStale(model string) bool {
	m, ok := b.table.Load().Model(model)
	if !ok {
		return false
	}
	for _, a := range m.Agents() {
		if a.Reason == dispatch.ReasonStale {
			return true
		}
	}
	return false
}

// abandon ends the current attempt for the broker and returns its number:
// the attempt number moves on (the old attempt's late chunks are dropped
// from now on), the sequence and the speaker start again, the old attempt
// is cancelled at its agents, its job leaves the queue if no agent took it,
// and what it counted in flight is released.
func (c *Call) abandon() uint32 {
	c.mu.Lock()
	old := c.attempt
	c.attempt++
	c.nextSeq, c.speaker, c.prefillSpeaker, c.others = 0, "", "", nil
	c.mu.Unlock()
	c.cancelAttempt(old)
	c.dropJob()
	c.forget()
	c.load.release()
	return old
}

// dropJob removes the current attempt's job from the stream if no agent
// said it took it, so that no agent, however late it starts, runs it for
// nobody, and the queue depth counts live requests only. The cancel
// published beside it stops an agent that pulled it a moment ago. Decode
// jobs are never dropped here: the prefill agent publishes them, and a
// decode leg must still take its hand-off to free the prefill engine's KV.
func (c *Call) dropJob() {
	seq := c.jobSeq
	c.jobSeq = 0
	if seq == 0 || c.agent != "" || c.prefillAgent != "" {
		return
	}
	c.b.deleteJobIn(c.jobStream(), seq)
}

// jobTaken reports whether the current attempt's job has left the stream:
// an agent acknowledged it (work-queue retention removes it at the ack),
// so its accepted chunk is on the way. Any doubt (no sequence, NATS not
// answering) is a no.
func (c *Call) jobTaken() bool {
	st := c.jobStream()
	if st == nil || c.jobSeq == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.b.publishTimeout)
	defer cancel()
	_, err := (*st).GetMsg(ctx, c.jobSeq)
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

// deleteJob deletes the job at seq from the jobs stream in the background.
// A job an agent took meanwhile is gone already (work-queue retention
// removes it at the ack): that answer is not an error worth a log line.
func (b *Broker) deleteJob(seq uint64) { b.deleteJobIn(b.stream.Load(), seq) }

// deleteJobIn deletes the job at seq from st (the jobs stream or the
// directed one) as deleteJob does.
func (b *Broker) deleteJobIn(st *jetstream.Stream, seq uint64) {
	if st == nil {
		return
	}
	b.jobDeletes.Add(1)
	go func() {
		defer b.jobDeletes.Done()
		ctx, cancel := context.WithTimeout(context.Background(), b.publishTimeout)
		defer cancel()
		if err := (*st).DeleteMsg(ctx, seq); err != nil && ctx.Err() == nil {
			b.log.Debug("abandoned job not deleted", "seq", seq, "err", err)
		}
	}()
}

// waitingForDecode reports whether the current attempt's prefill leg handed
// off and no decode agent took the hand-off yet.
func (c *Call) waitingForDecode() bool {
	return !c.handedOff.IsZero() && c.agent == ""
}
