package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// hwm bounds the messages a publisher queues, vLLM's default hwm: past
// it a batch is dropped (subscribers see a sequence gap), so a stuck
// subscriber never holds the engine back.
const hwm = 100_000

// discard silences zmq4's own logger.
var discard = log.New(io.Discard, "", 0)

// Publisher sends batches on a ZMQ PUB socket as vLLM does. It is safe
// for concurrent use; batches are numbered in the order Publish is called.
type Publisher struct {
	sock  zmq4.Socket
	topic []byte
	addr  string

	mu     sync.Mutex
	seq    uint64
	closed bool
}

// Listen binds a publisher on endpoint ("tcp://host:port", "*" for any
// host, port 0 for a free one).
func Listen(endpoint, topic string) (*Publisher, error) {
	sock := zmq4.NewPub(context.Background(), zmq4.WithLogger(discard))
	if err := sock.Listen(endpoint); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", endpoint, err)
	}
	if err := sock.SetOption(zmq4.OptionHWM, hwm); err != nil {
		_ = sock.Close()
		return nil, fmt.Errorf("kvevents: %w", err)
	}
	return &Publisher{sock: sock, topic: []byte(topic), addr: "tcp://" + sock.Addr().String()}, nil
}

// Endpoint returns the bound endpoint, "tcp://host:port", with the port
// actually bound.
func (p *Publisher) Endpoint() string { return p.addr }

// Publish sends events as one batch stamped now. With no subscriber the
// batch is dropped, as ZMQ does.
func (p *Publisher) Publish(events []Event) error {
	payload := Encode(Batch{Time: time.Now(), Events: events, DataParallelRank: -1})
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return net.ErrClosed
	}
	seq := make([]byte, 8)
	binary.BigEndian.PutUint64(seq, p.seq)
	p.seq++
	return p.sock.SendMulti(zmq4.NewMsgFrom(p.topic, seq, payload))
}

// Subscribers returns how many subscriptions the socket has, so that a
// test can wait for its subscriber before publishing (ZMQ drops what a
// late joiner has not subscribed to).
func (p *Publisher) Subscribers() int {
	if t, ok := p.sock.(zmq4.Topics); ok {
		return len(t.Topics())
	}
	return 0
}

// Close closes the socket. It is idempotent.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.sock.Close()
}

// Update is what a [Subscriber] hands on per batch.
type Update struct {
	// Seq is the batch's sequence number.
	Seq uint64
	// Resync tells that events may have been lost before this batch (the
	// first batch of a connection, a sequence gap, a restarted engine, a
	// batch that did not decode): what the consumer knew about the
	// engine's cache may be wrong, and it should forget it.
	Resync bool
	Batch  Batch
	// Summary is Batch's net effect on the device cache.
	Summary Summary
}

// Subscriber receives an engine's batches, reconnecting when the engine
// goes away.
type Subscriber struct {
	endpoint string
	topic    string
	retry    time.Duration
	log      *slog.Logger
}

// SubscriberOption sets a rare knob of NewSubscriber.
type SubscriberOption func(*Subscriber)

// WithRetry sets the pause between two connection attempts (default 500ms).
func WithRetry(d time.Duration) SubscriberOption {
	return func(s *Subscriber) {
		if d > 0 {
			s.retry = d
		}
	}
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) SubscriberOption {
	return func(s *Subscriber) {
		if l != nil {
			s.log = l
		}
	}
}

// NewSubscriber returns a subscriber to endpoint ("tcp://host:port", as
// the engine's --kv-events-config names it, with the engine's host for
// "*") for the topic prefix topic.
func NewSubscriber(endpoint, topic string, opts ...SubscriberOption) *Subscriber {
	s := &Subscriber{
		endpoint: strings.Replace(endpoint, "tcp://*:", "tcp://127.0.0.1:", 1),
		topic:    topic,
		retry:    500 * time.Millisecond,
		log:      slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Run receives batches and calls handle with each, in order, until ctx is
// done; then it returns nil. A lost connection is retried every retry
// interval, and the first update after it has Resync set.
func (s *Subscriber) Run(ctx context.Context, handle func(Update)) error {
	for {
		err := s.session(ctx, handle)
		if ctx.Err() != nil {
			return nil
		}
		s.log.LogAttrs(ctx, slog.LevelDebug, "kv events connection lost",
			slog.String("endpoint", s.endpoint), slog.String("error", err.Error()))
		t := time.NewTimer(s.retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// session runs one connection until it fails.
func (s *Subscriber) session(ctx context.Context, handle func(Update)) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(sctx, zmq4.WithLogger(discard), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.retry))
	defer sock.Close()
	if err := sock.Dial(s.endpoint); err != nil {
		return err
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, s.topic); err != nil {
		return err
	}
	var last uint64
	first, lost := true, false
	for {
		msg, err := sock.Recv()
		if err != nil {
			return err
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			lost = true
			s.log.LogAttrs(ctx, slog.LevelWarn, "kv events: message is not [topic, seq, payload]",
				slog.String("endpoint", s.endpoint), slog.Int("frames", len(msg.Frames)))
			continue
		}
		seq := binary.BigEndian.Uint64(msg.Frames[1])
		b, err := Decode(msg.Frames[2])
		if err != nil {
			lost = true
			s.log.LogAttrs(ctx, slog.LevelWarn, "kv events: undecodable batch",
				slog.String("endpoint", s.endpoint), slog.Uint64("seq", seq), slog.String("error", err.Error()))
			continue
		}
		u := Update{Seq: seq, Batch: b, Summary: Summarize(b.Events)}
		u.Resync = first || lost || seq != last+1
		first, lost, last = false, false, seq
		handle(u)
	}
}
