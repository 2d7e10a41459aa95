package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/subjects"
)

// Defaults of Config.
const (
	DefaultSlots     = 8
	DefaultHeartbeat = time.Second
	DefaultStream    = "SWITCHYARD_JOBS"
	// DefaultAckWait is how long JetStream waits for the ack of a delivered
	// job before offering it to another agent. The agent acks within
	// milliseconds of the delivery, so this only matters when an agent dies
	// in that window.
	DefaultAckWait = 10 * time.Second
	// DefaultPullWait bounds one pull request (its expiry); a draining
	// agent stops pulling within this. Below 10s a pull has no idle
	// heartbeat (jetstream's Fetch turns it on for longer pulls).
	DefaultPullWait = 2 * time.Second
	// DefaultHandoffGrace covers a decode agent's pull and its engine's KV
	// fetch after the prefill agent published the decode job.
	DefaultHandoffGrace = 3 * time.Second
	// DefaultKeepalive is how often a job with no token yet tells the
	// broker its engine is still working. It must stay well under the
	// broker's --stall-timeout (30s by default) so a long prefill is never
	// taken for a dead agent; 1s leaves room for many lost keep-alives.
	DefaultKeepalive = time.Second
	// DefaultKVHold is how long a prefill engine holds the KV blocks of a
	// hand-off for its decode leg: vLLM's NIXL lease
	// (VLLM_NIXL_ABORT_REQUEST_TIMEOUT) is 30s today.
	DefaultKVHold = 30 * time.Second
	// DefaultReplyLinger is how long a busy agent lets a reply chunk wait
	// for others to the same broker (see Config.ReplyLinger). A token
	// waits at most half its stream's last inter-token time besides, so
	// faster engines get less, and a stream's next token never catches up
	// with one that waits; an attempt's first token and its end never
	// wait, so neither TTFT nor the end of a request moves. Lingering
	// trades a bounded ITL delay for fewer, larger messages and less
	// broker and agent CPU per request (figures in docs/performance.md).
	DefaultReplyLinger = 2 * time.Millisecond
	// DefaultMaxAnswerBytes bounds what the agent relays of one engine
	// answer (the broker's own bound is the same).
	DefaultMaxAnswerBytes = 64 << 20
	// DefaultFirstEventTimeout bounds the wait for an engine's first event
	// after the request was sent: a prefill of a long prompt on a busy
	// engine (its queue included) produces nothing for a while, so it is
	// generous; the request's deadline bounds it too.
	DefaultFirstEventTimeout = 5 * time.Minute
	// DefaultProgressTimeout bounds the silence between an engine's events
	// once the first came: an engine decodes a token in milliseconds, so
	// a minute without one (whatever else it sends: headers, comments, a
	// byte at a time) is a hung engine.
	DefaultProgressTimeout = time.Minute
)

// Config is what an agent needs; zero fields take the defaults.
type Config struct {
	ID        string // default: hostname-pid
	Model     string // required
	Pool      string // regular, prefill or decode
	Slots     int
	Heartbeat time.Duration
	Prefix    string
	Stream    string
	Engine    string // adapter name, reported in heartbeats
	Transport string // http, grpc or inproc
	Version   string
	AckWait   time.Duration
	PullWait  time.Duration
	// PDProtocol ("vllm" or "sglang") is advertised by prefill and decode
	// agents; BootstrapHost and BootstrapPort by SGLang prefill agents.
	PDProtocol    string
	BootstrapHost string
	BootstrapPort int
	// HandoffGrace is how long a draining prefill agent stays after its last
	// hand-off, so the decode leg can still take the KV cache.
	HandoffGrace time.Duration
	// DrainTimeout bounds a drain: jobs still running this long after it
	// began are ended with a retryable "draining" error, which the broker
	// answers by retrying each elsewhere (or migrating it, after its first
	// token), and the agent exits. Zero waits for every job to finish.
	DrainTimeout time.Duration
	// PDLabels are the labels a prefill and a decode agent must share to
	// hand off to each other ("k=v,k=v": KV connector, engine version...).
	// With PDProtocol they make the agent's pairing key: a PD agent pulls
	// only its pairing's queue. Canonicalised by New; ignored by regular
	// agents.
	PDLabels string
	// SlowStart and SlowStartFloor bound what the agent holds after it
	// becomes ready, by the rule the broker weighs it with
	// (dispatch.Ramp): from the floor (a fraction of Slots, at least one
	// job) up to Slots over SlowStart. Zero SlowStart turns the ramp off,
	// as in dispatch.Config; the command defaults to the broker's 30s and
	// 0.1.
	SlowStart      time.Duration
	SlowStartFloor float64
	// Keepalive is the interval of keep-alive chunks while a job has no
	// token yet; zero takes DefaultKeepalive, a negative value turns them
	// off.
	Keepalive time.Duration
	// ReplyLinger bounds how long a chunk waits for others to the same
	// broker when the agent sends more than one message per ReplyLinger:
	// its next message leaves ReplyLinger after the last, or at once with
	// an attempt's first token or its end, which never wait, or sooner
	// when a token came less than two ReplyLingers after its stream's
	// last (it waits at most half that interval). A quiet agent sends
	// every chunk at once. Zero takes DefaultReplyLinger, a negative
	// value turns it off.
	ReplyLinger time.Duration
	// KVHold is how long this prefill agent's engine holds a hand-off's KV
	// for its decode leg: a decode job not taken within it is not run
	// (zero takes DefaultKVHold).
	KVHold time.Duration
	// NoDirected turns off the agent's directed queue (prefix-cache
	// affinity): it pulls only the pool's shared queue, and jobs a broker
	// offers it first reach it, or another agent, through the shared queue
	// once the broker's directed bound passes.
	NoDirected bool
	// NoBatch turns off the pool's batch queue: the agent runs
	// interactive work only.
	NoBatch bool
	// BatchReserve is the slots batch jobs never take, so that a burst
	// of interactive work starts at once without preempting any.
	BatchReserve int
	// BatchMax bounds the batch jobs held at once; 0: as many as the
	// reserve leaves.
	BatchMax int
	// NoBatchPreempt keeps an interactive job that finds no free slot
	// from preempting a batch job; it then waits for one to end.
	NoBatchPreempt bool
	// BatchIdleGate is how long the interactive pull must have waited,
	// unfilled, before a batch job may start (0: DefaultBatchIdleGate).
	BatchIdleGate time.Duration
	// KVEvents is the endpoint of the engine's KV-cache events (vLLM's
	// --kv-events-config, "tcp://127.0.0.1:5557"); the agent forwards them,
	// summarised, to the brokers. Empty: none.
	KVEvents string
	// KVEventsTopic is the events' topic prefix ("" takes all).
	KVEventsTopic string
	// KVEventsHash says what the engine's block hashes are: KVHashBroker
	// (the default: the broker's keys, as sim-engine's are) or KVHashVLLM
	// (hashes of token ids, which the agent translates to broker keys by
	// tokenizing each prompt with the engine: it needs WithTokenizer).
	KVEventsHash string
	// KVBlockSize is the engine's block size in tokens until its first
	// event tells it (default 16, vLLM's).
	KVBlockSize int
	// MaxAnswerBytes bounds the engine output the agent relays for one
	// attempt (its events' JSON, an embeddings answer); past it the attempt
	// fails with wire.CodeEngineOutputTooLarge and its engine request is
	// cancelled. Zero takes DefaultMaxAnswerBytes.
	MaxAnswerBytes int64
	// FirstEventTimeout and ProgressTimeout end an engine request that
	// stops producing events, with a retryable wire.CodeEngineStalled
	// error: FirstEventTimeout from the request to its first event,
	// ProgressTimeout between events after it. Zero takes the default, a
	// negative value turns the bound off. An attempt's silence is noticed
	// within twice its bound.
	FirstEventTimeout time.Duration
	ProgressTimeout   time.Duration
	// AffinityBlockSize is the brokers' words per prefix block (their
	// --affinity-block-size, default 16): KVHashVLLM translates to the
	// keys they compute.
	AffinityBlockSize int
}

// DefaultID is an agent's id when none is given: the host's name and the
// process id.
func DefaultID() string {
	h, _ := os.Hostname()
	if h == "" {
		h = "agent"
	}
	return h + "-" + strconv.Itoa(os.Getpid())
}

func (c *Config) setDefaults() {
	if c.ID == "" {
		c.ID = DefaultID()
	}
	if c.Pool == "" {
		c.Pool = subjects.PoolRegular
	}
	if c.BatchIdleGate <= 0 {
		c.BatchIdleGate = DefaultBatchIdleGate
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.Prefix == "" {
		c.Prefix = subjects.DefaultPrefix
	}
	if c.Stream == "" {
		c.Stream = DefaultStream
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.PullWait == 0 {
		c.PullWait = DefaultPullWait
	}
	if c.HandoffGrace == 0 {
		c.HandoffGrace = DefaultHandoffGrace
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Keepalive == 0 {
		c.Keepalive = DefaultKeepalive
	}
	if c.KVHold == 0 {
		c.KVHold = DefaultKVHold
	}
	if c.ReplyLinger == 0 {
		c.ReplyLinger = DefaultReplyLinger
	}
	if c.MaxAnswerBytes == 0 {
		c.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if c.FirstEventTimeout == 0 {
		c.FirstEventTimeout = DefaultFirstEventTimeout
	}
	if c.ProgressTimeout == 0 {
		c.ProgressTimeout = DefaultProgressTimeout
	}
	if c.KVEventsHash == "" {
		c.KVEventsHash = KVHashBroker
	}
	if l, err := subjects.CanonicalLabels(c.PDLabels); err == nil {
		c.PDLabels = l // a bad value stays for Validate to refuse
	}
}

// pairKey is the agent's PD pairing key; empty for regular agents.
func (c Config) pairKey() string {
	if c.Pool == subjects.PoolRegular {
		return ""
	}
	return subjects.PairKey(c.PDProtocol, c.PDLabels)
}

// ramp is the slow-start rule as the dispatch package states it.
func (c Config) ramp() dispatch.Config {
	return dispatch.Config{SlowStart: c.SlowStart, SlowStartFloor: c.SlowStartFloor}
}

// Validate reports what is wrong with c after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("model is required"))
	}
	if c.MaxAnswerBytes < 1 {
		errs = append(errs, fmt.Errorf("max answer bytes %d: want at least 1", c.MaxAnswerBytes))
	}
	b, err := subjects.New(c.Prefix)
	if err != nil {
		errs = append(errs, err)
	} else if c.Model != "" {
		if _, err := b.Heartbeat(c.Model, c.Pool, c.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Pool != subjects.PoolRegular && c.PDProtocol != "vllm" && c.PDProtocol != "sglang" {
		errs = append(errs, fmt.Errorf("pool %s: pd protocol %q: want vllm or sglang", c.Pool, c.PDProtocol))
	}
	if c.BatchReserve < 0 || c.BatchMax < 0 {
		errs = append(errs, fmt.Errorf("batch reserve %d and batch max %d: want 0 or more", c.BatchReserve, c.BatchMax))
	}
	if c.Slots < 1 {
		errs = append(errs, fmt.Errorf("slots %d: want at least 1", c.Slots))
	}
	if _, err := subjects.CanonicalLabels(c.PDLabels); err != nil {
		errs = append(errs, fmt.Errorf("pd labels: %w", err))
	}
	if err := c.ramp().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("slow start: %w", err))
	}
	if c.KVEventsHash != KVHashBroker && c.KVEventsHash != KVHashVLLM {
		errs = append(errs, fmt.Errorf("kv events hash %q: want %s or %s", c.KVEventsHash, KVHashBroker, KVHashVLLM))
	}
	if c.KVBlockSize < 0 || c.AffinityBlockSize < 0 {
		errs = append(errs, fmt.Errorf("kv block size %d, affinity block size %d: want positive sizes", c.KVBlockSize, c.AffinityBlockSize))
	}
	if c.KVHold < 0 {
		errs = append(errs, fmt.Errorf("kv hold %s: want a positive duration", c.KVHold))
	}
	if c.PullWait < time.Millisecond {
		// A pull's expiry (jetstream.FetchMaxWait) is a positive duration.
		errs = append(errs, fmt.Errorf("pull wait %s: want at least 1ms", c.PullWait))
	}
	if c.Heartbeat < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("heartbeat %s: want at least 10ms", c.Heartbeat))
	}
	return errors.Join(errs...)
}

// Option sets a rarely needed knob.
type Option func(*Agent)

// WithTokenizer sets what tokenizes prompts with the engine for
// Config.KVEventsHash KVHashVLLM.
func WithTokenizer(t PromptTokenizer) Option { return func(a *Agent) { a.tokenizer = t } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }
