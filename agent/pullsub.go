package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jobMessage is the part of a JetStream message a job's handling uses:
// jetstream.Msg has it, and so has jobMsg, what the pull loop receives.
type jobMessage interface {
	Data() []byte
	Ack() error
	DoubleAck(context.Context) error
	Nak() error
	NakWithDelay(time.Duration) error
	Term() error
}

// pullSub is one pull loop's standing subscription to its pull requests'
// answers. nats.go's Fetch subscribes an inbox per pull and runs a
// goroutine that moves each job from the subscription's channel to the
// batch's: two hand-offs and a timer per job, and a subscribe and an
// unsubscribe per pull. Here the read loop puts a job in one channel that
// the pull loop reads, and the inbox stays for the loop's life. It speaks
// the same protocol: a pull request is {"batch":n,"expires":ns} published
// to $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer> with the inbox as its
// reply subject; jobs come back as messages with data, and the pull's end,
// when it is not its n-th job, as a status message (a header with no
// data): 408 (expired), 404 (no messages), 409 (consumer deleted,
// leadership changed, ...), 503 (no responders: the consumer is not
// there), 400 (bad request).
type pullSub struct {
	nc    *nats.Conn
	inbox string
	ch    chan *nats.Msg
	sub   *nats.Subscription
}

// jsAPINext is the subject prefix of a consumer's pull requests (the
// default JetStream API prefix, as the agent's jetstream.New uses).
const jsAPINext = jetstream.DefaultAPIPrefix + "CONSUMER.MSG.NEXT."

// newPullSub subscribes an inbox for a pull loop that asks for at most
// room jobs at a time. Its channel holds two pulls' worth and more: a
// job delivered late to a pull that ended (an expiry that crossed it)
// waits there for the next one, where a full channel would drop it.
func newPullSub(nc *nats.Conn, room int) (*pullSub, error) {
	p := &pullSub{nc: nc, inbox: nc.NewInbox(), ch: make(chan *nats.Msg, 2*room+64)}
	sub, err := nc.ChanSubscribe(p.inbox, p.ch)
	if err != nil {
		return nil, fmt.Errorf("agent: subscribe pull inbox: %w", err)
	}
	p.sub = sub
	return p, nil
}

func (p *pullSub) close() { _ = p.sub.Unsubscribe() }

// request asks cons for up to n jobs, waiting at most wait for them.
func (p *pullSub) request(cons jetstream.Consumer, n int, wait time.Duration) error {
	info := cons.CachedInfo()
	if info == nil || info.Stream == "" {
		return errors.New("agent: consumer without info")
	}
	body := strconv.AppendInt([]byte(`{"batch":`), int64(n), 10)
	body = append(body, `,"expires":`...)
	body = strconv.AppendInt(body, wait.Nanoseconds(), 10)
	body = append(body, '}')
	return p.nc.PublishRequest(jsAPINext+info.Stream+"."+info.Name, p.inbox, body)
}

// errPullEnded is a pull's end that is no failure: it expired, or there
// was nothing to take.
var errPullEnded = errors.New("agent: pull ended")

// status returns nil for a job, errPullEnded for the end of a pull that
// is no failure, errNotEnd for a status that does not end it (an idle
// heartbeat), and the pull's failure otherwise, in the errors nats.go's
// Fetch reports (so consumerGone reads them alike).
func status(m *nats.Msg) error {
	if len(m.Data) > 0 || len(m.Header) == 0 {
		return nil
	}
	code := m.Header.Get("Status")
	if code == "" {
		return nil
	}
	desc := m.Header.Get("Description")
	switch code {
	case "100":
		return errNotEnd
	case "404", "408":
		return errPullEnded
	case "503":
		return nats.ErrNoResponders
	case "409":
		switch d := strings.ToLower(desc); {
		case strings.Contains(d, "consumer deleted"):
			return jetstream.ErrConsumerDeleted
		case strings.Contains(d, "leadership change"):
			return jetstream.ErrConsumerLeadershipChanged
		case strings.Contains(d, "server shutdown"):
			return jetstream.ErrServerShutdown
		}
	}
	return fmt.Errorf("nats: pull: %s %s", code, desc)
}

var errNotEnd = errors.New("agent: status that does not end a pull")

// jobMsg is a job as the pull loop receives it, with JetStream's acks: a
// message to its reply subject ($JS.ACK...), as jetstream.Msg sends them.
// Like jetstream.Msg, once an ack that ends the job (ack, nak, term) went
// out, it sends no other.
type jobMsg struct {
	nc    *nats.Conn
	m     *nats.Msg
	ended atomic.Bool
}

var errAcked = errors.New("agent: job already acknowledged")

func (j *jobMsg) Data() []byte { return j.m.Data }

func (j *jobMsg) end(body []byte) error {
	if j.ended.Load() {
		return errAcked
	}
	if err := j.nc.Publish(j.m.Reply, body); err != nil {
		return err
	}
	j.ended.Store(true)
	return nil
}

var (
	ackAck  = []byte("+ACK")
	ackNak  = []byte("-NAK")
	ackTerm = []byte("+TERM")
)

func (j *jobMsg) Ack() error  { return j.end(ackAck) }
func (j *jobMsg) Nak() error  { return j.end(ackNak) }
func (j *jobMsg) Term() error { return j.end(ackTerm) }

func (j *jobMsg) NakWithDelay(d time.Duration) error {
	return j.end(fmt.Appendf(nil, `-NAK {"delay": %d}`, d.Nanoseconds()))
}

// DoubleAck acks and waits for the server to confirm it (or ctx).
func (j *jobMsg) DoubleAck(ctx context.Context) error {
	if j.ended.Load() {
		return errAcked
	}
	if _, err := j.nc.RequestWithContext(ctx, j.m.Reply, ackAck); err != nil {
		return err
	}
	j.ended.Store(true)
	return nil
}
