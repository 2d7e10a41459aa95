package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

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
	// DefaultPullWait bounds one pull request; a draining agent stops
	// within this.
	DefaultPullWait = 2 * time.Second
	// DefaultHandoffGrace covers a decode agent's pull and its engine's KV
	// fetch after the prefill agent published the decode job.
	DefaultHandoffGrace = 3 * time.Second
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
}

func (c *Config) setDefaults() {
	if c.ID == "" {
		h, _ := os.Hostname()
		if h == "" {
			h = "agent"
		}
		c.ID = h + "-" + strconv.Itoa(os.Getpid())
	}
	if c.Pool == "" {
		c.Pool = subjects.PoolRegular
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
}

// Validate reports what is wrong with c after defaults are applied.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.Model == "" {
		errs = append(errs, errors.New("model is required"))
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
	if c.Slots < 1 {
		errs = append(errs, fmt.Errorf("slots %d: want at least 1", c.Slots))
	}
	if c.Heartbeat < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("heartbeat %s: want at least 10ms", c.Heartbeat))
	}
	return errors.Join(errs...)
}

// Option sets a rarely needed knob.
type Option func(*Agent)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }
