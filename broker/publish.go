package broker

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

// JetStream's error codes that mean "not now": the system is electing a
// leader, or the stream's replicas have no leader yet.
const (
	jsClusterNotAvail = 10008 // "JetStream system temporarily unavailable"
	jsNotEnabled      = 10076 // a node that restarted and has not yet enabled JetStream
	jsNotEnabledAcc   = 10039
)

// notNow reports whether a publish (or another JetStream request) failed
// for a reason that passes by itself on a cluster that lost a node: no
// responders or no answer while a stream leader is elected, NATS
// reconnecting to another node, JetStream not yet back on a node. A full
// queue is not one of them: it stays a 429.
func notNow(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jsClusterNotAvail, jsNotEnabled, jsNotEnabledAcc:
			return true
		}
		return false
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrStaleConnection)
}

// jobMsgID is the JetStream message id of an attempt's job: a try whose
// answer was lost in a failover but whose job was stored is not stored
// again when the publish is tried again (the stream's duplicate window
// answers with the first one's sequence).
func jobMsgID(request string, attempt uint32) string {
	return string(appendJobMsgID(nil, request, attempt))
}

// appendJobMsgID appends jobMsgID(request, attempt) to dst.
func appendJobMsgID(dst []byte, request string, attempt uint32) []byte {
	dst = append(append(dst, request...), '.')
	return strconv.AppendUint(dst, uint64(attempt), 10)
}

// publishJob stores an attempt's job, riding out a stream leader election
// and a reconnect: a try that fails "not now" is tried again with backoff
// until the job is stored, ctx ends, or until passes. Each try is bounded
// by the publish timeout, so a try sent to a node that died is given up
// for the next. A full queue, or any other answer, ends it at once.
func (b *Broker) publishJob(ctx context.Context, subject string, data []byte, msgID string, until time.Time) (*jetstream.PubAck, error) {
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	backoff := publishBackoffMin
	for tries := 1; ; tries++ {
		tctx, tcancel := context.WithTimeout(ctx, b.publishTimeout)
		ack, err := b.js.Publish(tctx, subject, data, jetstream.WithMsgID(msgID))
		tcancel()
		if err == nil {
			if tries > 1 {
				b.log.Info("job published after a failover", "subject", subject, "msg_id", msgID, "tries", tries, "duplicate", ack.Duplicate)
			}
			return ack, nil
		}
		if !notNow(err) || ctx.Err() != nil || b.nc.IsClosed() {
			return nil, err
		}
		b.metrics.publishRetries.Inc()
		b.log.Debug("job not published yet, retrying", "subject", subject, "msg_id", msgID, "err", err, "backoff", backoff)
		if !b.waitConnected(ctx, backoff) {
			return nil, err
		}
		backoff = min(2*backoff, publishBackoffMax)
	}
}

// waitConnected waits at least d, and while NATS is away until it is
// back; false if ctx ended first.
func (b *Broker) waitConnected(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	dl, _ := ctx.Deadline()
	return b.awaitConnected(ctx, dl) && ctx.Err() == nil
}

// awaitConnected waits until NATS is connected, ctx ends or until passes,
// and reports whether it is connected.
func (b *Broker) awaitConnected(ctx context.Context, until time.Time) bool {
	if !until.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}
	for !b.nc.IsConnected() {
		if b.nc.IsClosed() {
			return false // closed for good: nothing to wait for
		}
		select {
		case <-ctx.Done():
			return b.nc.IsConnected()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
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

// pubAckState is what the broker's ack subscription learned of the current
// attempt's publish (see publishOnce). Guarded by Call.mu.
type pubAckState struct {
	attempt uint32
	waiting bool // a publishOnce of attempt waits for its ack
	done    bool // the ack came: ok and seq below
	ok      bool
	seq     uint64
}

// timers are reused by publishOnce and by calls (see Call.Next): since Go
// 1.23 a stopped timer sends nothing stale, so a timer can go back to the
// pool once stopped.
var timers = sync.Pool{New: func() any { return time.NewTimer(time.Hour) }}

// publish stores the current attempt's job and returns its stream
// sequence. The common case is one try whose ack comes to the broker's own
// ack subscription (publishOnce); anything else (no ack in time, an error,
// no stream, NATS away) is left to publishJob, which tries again with the
// same message id, so a job the first try stored is not stored twice.
func (c *Call) publish(ctx context.Context, subject string, data []byte, attempt uint32) (uint64, error) {
	// The ack's subject, <ackPrefix><request>.<attempt>, ends with the
	// job's message id (jobMsgID): one string for both.
	var buf [128]byte
	ackSubject := string(appendJobMsgID(append(buf[:0], c.b.ackPrefix...), c.ID, attempt))
	msgID := ackSubject[len(c.b.ackPrefix):]
	until := c.publishUntil()
	if seq, ok := c.publishOnce(ctx, subject, data, ackSubject, msgID, attempt, until); ok {
		return seq, nil
	}
	ack, err := c.b.publishJob(ctx, subject, data, msgID, until)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// publishOnce publishes the job once, with the reply subject of the
// broker's ack subscription, and waits for its ack on the call's own
// wake-up channel: no context, response map, channel or JSON decode per
// job, which the JetStream client's Publish spends. It reports whether the
// stream took the job.
//
// Its waiting consumes wake-ups meant for the reader; the reader looks at
// its queue before it waits, so a chunk relayed meanwhile is not missed.
func (c *Call) publishOnce(ctx context.Context, subject string, data []byte, ackSubject, msgID string, attempt uint32, until time.Time) (uint64, bool) {
	b := c.b
	wait := min(b.publishTimeout, time.Until(until))
	if wait <= 0 || !b.nc.IsConnected() {
		return 0, false
	}
	c.mu.Lock()
	c.ack = pubAckState{attempt: attempt, waiting: true}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.ack = pubAckState{}
		c.mu.Unlock()
	}()
	// The message and its header's value live in the call (nats.go
	// copies them out as it publishes); its header map is made once.
	if c.pub.Header == nil {
		c.pub.Header = make(nats.Header, 1)
	}
	c.pubVal[0] = msgID
	c.pub.Header[jetstream.MsgIDHeader] = c.pubVal[:]
	c.pub.Subject, c.pub.Reply, c.pub.Data = subject, ackSubject, data
	err := b.nc.PublishMsg(&c.pub)
	c.pub.Data = nil // the job's encoding, not ours to keep
	if err != nil {
		return 0, false
	}
	t := timers.Get().(*time.Timer)
	t.Reset(wait)
	defer func() {
		t.Stop()
		timers.Put(t)
	}()
	for {
		c.mu.Lock()
		a := c.ack
		c.mu.Unlock()
		if a.done {
			return a.seq, a.ok
		}
		select {
		case <-c.ready:
		case <-t.C:
			return 0, false
		case <-ctx.Done():
			return 0, false
		}
	}
}

// onAck takes the stream's answer to a publishOnce to its call. The
// subject names the call and its attempt; an answer for an attempt no
// longer waiting (given up to publishJob) is dropped.
func (b *Broker) onAck(m *nats.Msg) {
	rest, ok := strings.CutPrefix(m.Subject, b.ackPrefix)
	i := strings.LastIndexByte(rest, '.')
	if !ok || i < 0 {
		return
	}
	attempt, err := strconv.ParseUint(rest[i+1:], 10, 32)
	if err != nil {
		return
	}
	v, found := b.calls.Load(rest[:i])
	if !found {
		return
	}
	c := v.(*Call)
	seq, good := parsePubAck(m)
	c.mu.Lock()
	mine := c.ack.waiting && c.ack.attempt == uint32(attempt)
	if mine {
		c.ack.done, c.ack.ok, c.ack.seq = true, good, seq
	}
	c.mu.Unlock()
	if mine {
		select {
		case c.ready <- struct{}{}:
		default:
		}
	}
}

// parsePubAck reads a JetStream publish ack, {"stream":"S","seq":N} with
// maybe "duplicate" or "domain", and reports its sequence and whether it
// is one. An error answer ({"error":{...}}), a status message (no
// responders) or anything unexpected is not: publishJob then tries again
// and reads the answer with the JetStream client.
func parsePubAck(m *nats.Msg) (uint64, bool) {
	d := m.Data
	if len(d) == 0 || m.Header.Get("Status") != "" || bytes.Contains(d, []byte(`"error"`)) {
		return 0, false
	}
	const key = `"seq":`
	i := bytes.Index(d, []byte(key))
	if i < 0 {
		return 0, false
	}
	d = d[i+len(key):]
	var seq uint64
	n := 0
	for ; n < len(d) && d[n] >= '0' && d[n] <= '9'; n++ {
		if n == 19 {
			return 0, false // past what a uint64 surely holds: not an ack of ours
		}
		seq = seq*10 + uint64(d[n]-'0')
	}
	if n == 0 || seq == 0 {
		return 0, false
	}
	return seq, true
}
