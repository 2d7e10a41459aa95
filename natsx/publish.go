package natsx

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Retry says how Publish tries again.
type Retry struct {
	// Try bounds one try, so that a try sent to a node that died is given
	// up for the next; zero leaves it to ctx.
	Try time.Duration
	// MinBackoff is the wait after the first failed try; each wait doubles
	// the one before, up to MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Retrying, if set, is called before each wait with the failed try's
	// error and the wait: the caller's count and log.
	Retrying func(err error, backoff time.Duration)
}

// Publish stores data on subject through js under the message id msgID,
// riding out a stream leader election and a reconnect: a try that fails
// NotNow is tried again after a backoff, and while NATS is away only once
// it is back, until the message is stored, ctx ends or the connection is
// closed for good. Any other answer, a full queue among them, ends it at
// once with that error; so does the end of ctx or of the connection, with
// the last try's error. The message id is what makes a second try safe: a
// try whose answer was lost but whose message was stored is answered as a
// duplicate of it, within the stream's duplicate window. tries counts the
// tries made.
func Publish(ctx context.Context, js jetstream.JetStream, subject string, data []byte, msgID string, r Retry) (ack *jetstream.PubAck, tries int, err error) {
	nc := js.Conn()
	backoff := r.MinBackoff
	for tries = 1; ; tries++ {
		tctx, cancel := ctx, context.CancelFunc(func() {})
		if r.Try > 0 {
			tctx, cancel = context.WithTimeout(ctx, r.Try)
		}
		ack, err = js.Publish(tctx, subject, data, jetstream.WithMsgID(msgID))
		cancel()
		if err == nil {
			return ack, tries, nil
		}
		if !NotNow(err) || ctx.Err() != nil || nc.IsClosed() {
			return nil, tries, err
		}
		if r.Retrying != nil {
			r.Retrying(err, backoff)
		}
		if !wait(ctx, backoff) || !AwaitConnected(ctx, nc) || ctx.Err() != nil {
			return nil, tries, err
		}
		backoff = min(2*backoff, r.MaxBackoff)
	}
}

// wait waits d; false if ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// AwaitConnected waits until nc is connected, ctx ends or nc is closed for
// good, and reports whether nc is connected. It waits on nc's status
// changes, not by polling.
func AwaitConnected(ctx context.Context, nc *nats.Conn) bool {
	if nc.IsConnected() {
		return true
	}
	ch := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(ch)
	for {
		// Checked after registering ch, and after each change: a change
		// before ch was registered, or one dropped from a full ch, is seen
		// here.
		switch {
		case nc.IsConnected():
			return true
		case nc.IsClosed():
			return false
		}
		select {
		case <-ctx.Done():
			return nc.IsConnected()
		case <-ch:
		}
	}
}
