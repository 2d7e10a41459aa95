package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/natsx"
)

// streamHealth is what the broker knows of its jobs stream's ability to
// take jobs, beyond the connection: whether it could create the stream,
// whether the stream has a leader (its replicas agree), and whether the
// servers refused a write. Ready reports the first problem; the keeper
// (keepStream) logs each change.
type streamHealth struct {
	mu sync.Mutex
	// create is the last failure to create or update the stream; nil once
	// it exists as configured.
	create error
	// write is the last write the servers refused (insufficient
	// resources, a permission), at writeAt; cleared by a probe write that
	// succeeds writeRefusalHold after it.
	write   error
	writeAt time.Time
	// leaderless is when the stream was first found without a leader, and
	// unanswered when its info first went unanswered; zero: not now.
	leaderless, unanswered time.Time
	infoErr                error // the last unanswered info's error
	// described is the stream's storage and replicas as last read.
	described string
	// logged is the problem last logged ("" = healthy).
	logged string
}

// streamStallGrace is how long the stream may go without a leader, or
// without answering, before the broker says it cannot take jobs: longer
// than a leader election after the loss of a node, which requests wait out
// (Config.PublishWait).
func (b *Broker) streamStallGrace() time.Duration { return b.cfg.PublishWait }

// streamProblem returns why the jobs stream cannot take jobs now, nil if
// it can (as far as the broker knows). The error is ErrStreamUnusable.
func (b *Broker) streamProblem() error {
	h := &b.health
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	grace := b.streamStallGrace()
	name := b.cfg.Stream
	if h.described != "" {
		name += " (" + h.described + ")"
	}
	var why string
	switch {
	case h.create != nil:
		why = "cannot create it: " + describeJSError(h.create)
	case !h.leaderless.IsZero() && now.Sub(h.leaderless) >= grace:
		why = fmt.Sprintf("it has had no leader for %s: its replicas cannot agree, for a storage or replica count the servers cannot serve (max_memory_store, too few servers) or servers lost", now.Sub(h.leaderless).Round(time.Second))
	case !h.unanswered.IsZero() && now.Sub(h.unanswered) >= grace:
		why = fmt.Sprintf("JetStream has not answered about it for %s: %s", now.Sub(h.unanswered).Round(time.Second), describeJSError(h.infoErr))
	case h.write != nil:
		why = "the servers refuse to store jobs: " + describeJSError(h.write)
	default:
		return nil
	}
	if h.write != nil && h.create == nil && !strings.Contains(why, "refuse") {
		why += "; last write refused: " + describeJSError(h.write)
	}
	return fmt.Errorf("%w: %s: %s", ErrStreamUnusable, name, why)
}

// describeJSError says what JetStream answered: its description and error
// code for an API error, the permission the server denied for a request it
// left unanswered.
func describeJSError(err error) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return fmt.Sprintf("%s (JetStream error %d)", apiErr.Description, apiErr.ErrorCode)
	}
	return err.Error()
}

// explainJS adds to err, a JetStream request that went unanswered, the
// permission violation the server reported for the stream, if any: a
// request refused for permissions gets no answer, and only the
// connection's last error says why.
func (b *Broker) explainJS(err error) error {
	if err == nil {
		return nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return err
	}
	if last := b.nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), b.cfg.Stream) {
		return fmt.Errorf("%w: permission denied (%v): give the broker's NATS user that permission", err, last)
	}
	return err
}

// noteCreate records the outcome of creating or updating the stream.
func (b *Broker) noteCreate(err error) {
	b.health.mu.Lock()
	b.health.create = err
	b.health.mu.Unlock()
	b.logStreamHealth()
}

// noteWrite records a job publish the servers refused: an answer that is
// neither "not now" (an election, a reconnect, which the publish rides
// out) nor a full queue (an answer to the client). A permission violation
// on the jobs subjects counts too.
func (b *Broker) noteWrite(err error) {
	if err == nil || natsx.QueueFull(err) || errors.Is(err, context.Canceled) {
		return
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && natsx.NotNow(err) {
		return
	}
	if apiErr == nil {
		last := b.nc.LastError()
		if !errors.Is(last, nats.ErrPermissionViolation) || !strings.Contains(last.Error(), b.subj.Prefix()+".jobs.") {
			return
		}
		err = fmt.Errorf("permission denied: %w", last)
	}
	b.health.mu.Lock()
	b.health.write, b.health.writeAt = err, time.Now()
	b.health.mu.Unlock()
	b.logStreamHealth()
}

// writeRefusalHold is how long a refused write keeps the broker not ready
// at least, however a probe fares meanwhile: a server whose memory frees
// between bursts of jobs would otherwise make readiness flap with every
// burst.
const writeRefusalHold = 5 * time.Second

// noteInfo records what a check of the stream found: its info, or the
// error of asking for it.
func (b *Broker) noteInfo(info *jetstream.StreamInfo, err error) {
	h := &b.health
	h.mu.Lock()
	now := time.Now()
	switch {
	case err != nil:
		h.infoErr = err
		if h.unanswered.IsZero() {
			h.unanswered = now
		}
	default:
		h.unanswered = time.Time{}
		h.described = fmt.Sprintf("%s storage, replicas %d", info.Config.Storage, info.Config.Replicas)
		if info.Cluster != nil && info.Cluster.Leader == "" {
			if h.leaderless.IsZero() {
				h.leaderless = now
			}
		} else {
			h.leaderless = time.Time{}
		}
	}
	h.mu.Unlock()
	b.logStreamHealth()
}

// logStreamHealth logs a change of the stream's health: the problem, with
// its cause, when it appears or changes, and its end.
func (b *Broker) logStreamHealth() {
	var now string
	if err := b.streamProblem(); err != nil {
		now = err.Error()
	}
	h := &b.health
	h.mu.Lock()
	prev := h.logged
	h.logged = now
	h.mu.Unlock()
	switch {
	case now == prev:
	case now != "":
		b.log.Error("jobs stream cannot take jobs; the broker is not ready", "stream", b.cfg.Stream, "err", now)
	default:
		b.log.Info("jobs stream takes jobs again", "stream", b.cfg.Stream)
	}
}

// probeWrite stores a message on the stream's probe subject, which no
// queue's consumer takes, and deletes it: whether the servers store what
// the broker writes. It records the outcome.
func (b *Broker) probeWrite(ctx context.Context) {
	b.health.mu.Lock()
	held := b.health.write != nil && time.Since(b.health.writeAt) < writeRefusalHold
	b.health.mu.Unlock()
	if held {
		return
	}
	subj, err := b.subj.JobsProbe(b.cfg.ID)
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, b.publishTimeout)
	defer cancel()
	ack, err := b.js.Publish(pctx, subj, nil)
	if err != nil {
		if ctx.Err() == nil {
			b.noteWrite(err)
		}
		return
	}
	if st := b.stream.Load(); st != nil {
		_ = (*st).DeleteMsg(pctx, ack.Sequence)
	}
	b.health.mu.Lock()
	b.health.write = nil
	b.health.mu.Unlock()
	b.logStreamHealth()
}

// writeRefused reports whether a job publish was refused (noteWrite) and
// not yet found to pass again.
func (b *Broker) writeRefused() bool {
	b.health.mu.Lock()
	defer b.health.mu.Unlock()
	return b.health.write != nil
}
