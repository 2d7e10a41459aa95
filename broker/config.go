package broker

import (
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/subjects"
)

// Defaults of Config.
const (
	DefaultStream            = "SWITCHYARD_JOBS"
	DefaultQueueMax          = 1024
	DefaultHeartbeatInterval = time.Second
	DefaultRequestTimeout    = 10 * time.Minute
	DefaultMaxAnswerBytes    = 64 << 20
	DefaultBufferBytes       = 8 << 20
	DefaultStallTimeout      = 30 * time.Second
	DefaultRetryLimit        = 2
	DefaultMigrationLimit    = 1
	DefaultQueueTimeout      = time.Minute
	DefaultAcceptTimeout     = time.Second
	DefaultWatchInterval     = 250 * time.Millisecond
	DefaultKVHold            = 30 * time.Second
)

// Config is what a broker needs; zero fields take the defaults above.
type Config struct {
	// ID names this broker in reply subjects; it must be unique among the
	// brokers of one NATS. Default: random.
	ID string
	// Prefix of every subject (default "sy").
	Prefix string
	// Stream is the JetStream stream holding jobs.
	Stream string
	// Replicas of the jobs stream: 1 on a single server, 3 on a cluster.
	Replicas int
	// DirectedFileStorage keeps the directed queues' stream (affinity
	// offers, subjects.DirectedStream) on disk. False is memory, which a
	// server that gives JetStream no memory refuses: the broker then
	// creates it on disk. That stream has one replica whatever Replicas
	// says (docs/affinity.md).
	DirectedFileStorage bool
	// FileStorage keeps queued jobs on disk, so they outlive a restart of
	// the NATS server that holds them, and fits servers that give
	// JetStream disk only (max_memory_store 0, as the NATS Helm chart's).
	// False is memory: a job lives for as long as a client waits on it,
	// the broker dispatches again a job lost with its server, and a work
	// queue that drains after every job costs a file store a block file
	// deleted and created per job (docs/performance.md). An existing
	// stream keeps the storage it was created with. The broker command's
	// default is file.
	FileStorage bool
	// QueueMax bounds the jobs waiting per (model, pool); beyond it Submit
	// fails with ErrQueueFull.
	QueueMax int
	// HeartbeatInterval is the agents' interval; the broker is ready once it
	// has listened for one.
	HeartbeatInterval time.Duration
	// RequestTimeout is the deadline of a request that brings none.
	RequestTimeout time.Duration
	// MaxAnswerBytes bounds one request's answer, the engine output
	// relayed to it across its attempts: past it the request ends with
	// ErrAnswerTooLarge and its engine request is cancelled. It bounds the
	// memory of an answer read whole (non-streaming, embeddings) and the
	// work an engine can make the broker do for one request.
	MaxAnswerBytes int64
	// BufferBytes bounds the bytes relayed to one streaming request and
	// not yet read by its client (the chunks' encodings and what their
	// decoding holds): a client that lets more wait is ended with
	// ErrSlowReader. The reply goroutine never waits for a client, so this
	// is what a client that stops reading costs. An answer read whole is
	// bounded by MaxAnswerBytes instead.
	BufferBytes int64
	// StallTimeout ends a request whose agent sends nothing for this long.
	StallTimeout time.Duration
	// QueueTimeout ends a request that no agent took this long after it
	// was submitted.
	QueueTimeout time.Duration
	// RetryLimit bounds the retries of a request before its first token.
	RetryLimit int
	// MigrationLimit bounds the migrations of a stream after its first
	// token; -1 disables migration (0 takes the default).
	MigrationLimit int
	// AcceptTimeout is how long an attempt may wait for an agent before the
	// broker checks whether anyone can take it (or whether its agent died).
	AcceptTimeout time.Duration
	// WatchInterval is how often a waiting request checks its attempt.
	WatchInterval time.Duration
	// KVHold is how long a prefill engine holds the KV of a hand-off for
	// its decode leg (vLLM NIXL's lease is 30s): a PD attempt whose decode
	// job no decode agent took within it after the hand-off is abandoned
	// and the request retried, since its KV is gone. Match the agents'
	// --kv-hold.
	KVHold time.Duration
	// CapacityWait is how long a request for a known model with no agent
	// serving it now (all warming, draining or gone) waits for one to
	// become ready before it is refused with ErrNoCapacity (503 with
	// Retry-After). Zero refuses at once. A request never waits in a queue
	// that no agent pulls.
	CapacityWait time.Duration
	// PublishWait bounds how long a request waits for NATS to take its
	// job (the first attempt's, a retry's or a migration's) while a
	// cluster elects a stream leader or the broker reconnects to another
	// node; within it "not now" answers are tried again. A request that
	// arrives while the broker is disconnected waits for the reconnect
	// within it too. Past it the request gets ErrNotConnected (503 with
	// Retry-After). Never past the request's deadline.
	PublishWait time.Duration
	// Dispatch configures the routing decision.
	Dispatch dispatch.Config
	// Targets are the latency targets of every request, field by field
	// where the request sets none (Request.Targets); zero: none.
	Targets Targets
	// Affinity configures prefix-cache affinity within a pool (see
	// affinity.go); its zero value is DefaultAffinity with defaults.
	Affinity AffinityConfig
	// Models are models the fleet serves even while no agent does, as a
	// fleet scaled to zero: a request for one is not refused as unknown
	// (it waits CapacityWait for an agent), and the pool metrics of each
	// of its pools read 0 rather than nothing, however long no agent has
	// served it. Models heard from agents are known without it, until
	// none has been heard for five minutes.
	Models []string
	// LearnListeners, when set, returns how many subscriptions a message
	// on subject would reach in the broker's NATS account, the broker's
	// own included. A broker that alone listens to learn messages then
	// publishes none (they would reach nobody; its connection has no
	// echo). Nil: unknown, and every learn message is published. The
	// command sets it for an embedded server without gateways.
	LearnListeners func(subject string) int
}

func (c *Config) setDefaults() {
	if c.ID == "" {
		c.ID = randomID(8)
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.QueueMax == 0 {
		c.QueueMax = DefaultQueueMax
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxAnswerBytes == 0 {
		c.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if c.BufferBytes == 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = DefaultStallTimeout
	}
	if c.RetryLimit == 0 {
		c.RetryLimit = DefaultRetryLimit
	}
	if c.QueueTimeout == 0 {
		c.QueueTimeout = DefaultQueueTimeout
	}
	if c.MigrationLimit == 0 {
		c.MigrationLimit = DefaultMigrationLimit
	}
	if c.AcceptTimeout == 0 {
		c.AcceptTimeout = DefaultAcceptTimeout
	}
	if c.WatchInterval == 0 {
		c.WatchInterval = DefaultWatchInterval
	}
	if c.KVHold == 0 {
		c.KVHold = DefaultKVHold
	}
	if c.PublishWait == 0 {
		c.PublishWait = DefaultPublishWait
	}
	c.Affinity.setDefaults()
}

// Validate reports what is wrong with c after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if _, err := subjects.New(c.Prefix); err != nil {
		errs = append(errs, err)
	}
	if _, err := subjects.Must(subjects.DefaultPrefix).Reply(c.ID, "x"); err != nil {
		errs = append(errs, fmt.Errorf("broker id %q: only letters, digits, '-' and '_'", c.ID))
	}
	for _, m := range c.Models {
		if _, err := subjects.Must(subjects.DefaultPrefix).Jobs(m, subjects.PoolRegular); err != nil {
			errs = append(errs, fmt.Errorf("model %q: %w", m, err))
		}
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas %d: want 1 to 5", c.Replicas))
	}
	if c.QueueMax < 1 {
		errs = append(errs, fmt.Errorf("queue max %d: want at least 1", c.QueueMax))
	}
	if c.HeartbeatInterval < 0 || c.RequestTimeout < 0 || c.StallTimeout < 0 || c.KVHold < 0 || c.CapacityWait < 0 || c.PublishWait < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if c.Targets.TTFT < 0 || c.Targets.ITL < 0 {
		errs = append(errs, errors.New("latency targets must not be negative"))
	}
	if c.MaxAnswerBytes < 1 {
		errs = append(errs, fmt.Errorf("max answer bytes %d: want at least 1", c.MaxAnswerBytes))
	}
	if c.BufferBytes < 1 {
		errs = append(errs, fmt.Errorf("buffer bytes %d: want at least 1", c.BufferBytes))
	}
	if err := c.Dispatch.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Affinity.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Option sets a rarely needed knob.
type Option func(*Broker)

// WithConnStatus gives the broker a way to say why NATS is not connected
// (the server's or the TLS stack's words), for Ready and the fleet view;
// without it, a down connection is just ErrNotConnected.
func WithConnStatus(why func() error) Option { return func(b *Broker) { b.connWhy = why } }

// WithLogger sets the logger (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(b *Broker) { b.log = l } }

// WithRand sets the source of the dispatch decision's randomness, so tests
// can make routing deterministic.
func WithRand(r func() uint64) Option { return func(b *Broker) { b.rand = r } }

// WithClock sets the clock used for freshness and deadlines.
func WithClock(now func() time.Time) Option { return func(b *Broker) { b.now = now } }

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomID(n int) string { return string(appendRandomID(nil, n)) }

// appendRandomID appends n random characters of idAlphabet to dst.
func appendRandomID(dst []byte, n int) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	_, _ = rand.Read(dst[start:])
	for i := start; i < len(dst); i++ {
		dst[i] = idAlphabet[int(dst[i])%len(idAlphabet)]
	}
	return dst
}
