package dispatch

import (
	"fmt"
	"math"
	"time"
)

// Defaults of DefaultConfig.
const (
	DefaultSlowStart        = 30 * time.Second
	DefaultSlowStartFloor   = 0.1
	DefaultMissedHeartbeats = 3
	DefaultPDThreshold      = 512
	DefaultTimingMaxAge     = time.Minute
	DefaultProbeShare       = 1.0 / 50
	DefaultProbeAge         = 15 * time.Second
	DefaultProbeSamples     = 8
	DefaultProbeTokens      = 1024
)

// Config tunes the rule. Use DefaultConfig and change what you need; the
// zero value is valid too (capacity mode, slow start off, 3 missed
// heartbeats).
type Config struct {
	// Mode selects the weight rule. The zero value is ModeCapacity.
	Mode Mode

	// SlowStart is the window after an agent's ReadySince over which its
	// effective slots ramp linearly from the floor to its full Slots, so the
	// first agent of a new pool is not hit by the whole queue at once.
	// Zero disables the ramp (ready agents count in full at once).
	// DefaultConfig sets 30s.
	SlowStart time.Duration

	// SlowStartFloor is the fraction of an agent's slots it counts with at
	// the start of the ramp, when it becomes ready (a warming agent counts
	// zero). The floor is never below one slot (nor above Slots), so a new
	// agent with few slots still draws some traffic. In [0, 1];
	// DefaultConfig sets 0.1.
	SlowStartFloor float64

	// MissedHeartbeats is how many heartbeat intervals may pass without a
	// heartbeat before an agent counts as gone. Zero means
	// DefaultMissedHeartbeats (3).
	MissedHeartbeats int

	// PDThreshold is ModeThreshold's bound, in prompt tokens: a request
	// whose prompt tokens not cached on the regular pool exceed it goes to
	// PD. Zero sends every prompt that is not wholly cached to PD.
	// DefaultConfig sets 512.
	PDThreshold int

	// TimingMaxAge is how old an agent's Timing may be (since its Updated)
	// and still count in ModeSLO. A route no request went to for that long
	// has no history, so the decision weighs by capacity until the route's
	// figures are fresh again. Zero means figures never age. DefaultConfig
	// sets 1 minute.
	TimingMaxAge time.Duration

	// ProbeShare is the share of ModeSLO's requests with targets that go,
	// as probes, to a route the predictions avoid whose figures are stale
	// (see ProbeAge and ProbeSamples), so that its figures are learned
	// afresh rather than kept from another load until they age out. A
	// probe needs free capacity on the route and a prompt of at most
	// ProbeTokens tokens. Its resolution is 1/2048; 0 disables probes. In
	// [0, 1]; DefaultConfig sets 1/50.
	ProbeShare float64
	// ProbeAge is how old a route's newest sample may be before its
	// figures count as stale for probing; 0 means only ProbeSamples
	// decides. DefaultConfig sets 15 seconds.
	ProbeAge time.Duration
	// ProbeSamples: a route whose figures are drawn from fewer samples on
	// one of its legs counts as stale for probing. DefaultConfig sets 8.
	ProbeSamples int
	// ProbeTokens is the longest prompt, in tokens, sent as a probe: a
	// probe is cheap. Zero means DefaultProbeTokens.
	ProbeTokens int
}

// DefaultConfig returns capacity mode, a 30s slow start from a floor of
// 10% of slots, gone after 3 missed heartbeats; for the other modes a PD
// threshold of 512 tokens, timing that ages out after a minute, and
// probes of 1 in 50 requests to routes with figures older than 15 seconds
// or drawn from fewer than 8 samples. The broker command runs ModeSLO by
// default, which decides a request without targets as ModeCapacity does.
func DefaultConfig() Config {
	return Config{
		Mode:             ModeCapacity,
		SlowStart:        DefaultSlowStart,
		SlowStartFloor:   DefaultSlowStartFloor,
		MissedHeartbeats: DefaultMissedHeartbeats,
		PDThreshold:      DefaultPDThreshold,
		TimingMaxAge:     DefaultTimingMaxAge,
		ProbeShare:       DefaultProbeShare,
		ProbeAge:         DefaultProbeAge,
		ProbeSamples:     DefaultProbeSamples,
		ProbeTokens:      DefaultProbeTokens,
	}
}

// Validate reports the first field outside its documented range, wrapping
// ErrInvalid.
func (c Config) Validate() error {
	switch {
	case c.Mode >= numModes:
		return fmt.Errorf("%w: config mode %v", ErrInvalid, c.Mode)
	case c.SlowStart < 0:
		return fmt.Errorf("%w: config slow start %v is negative", ErrInvalid, c.SlowStart)
	case math.IsNaN(c.SlowStartFloor) || c.SlowStartFloor < 0 || c.SlowStartFloor > 1:
		return fmt.Errorf("%w: config slow start floor %v is outside [0, 1]", ErrInvalid, c.SlowStartFloor)
	case c.MissedHeartbeats < 0:
		return fmt.Errorf("%w: config missed heartbeats %d is negative", ErrInvalid, c.MissedHeartbeats)
	case c.PDThreshold < 0:
		return fmt.Errorf("%w: config PD threshold %d is negative", ErrInvalid, c.PDThreshold)
	case c.TimingMaxAge < 0:
		return fmt.Errorf("%w: config timing max age %v is negative", ErrInvalid, c.TimingMaxAge)
	case math.IsNaN(c.ProbeShare) || c.ProbeShare < 0 || c.ProbeShare > 1:
		return fmt.Errorf("%w: config probe share %v is outside [0, 1]", ErrInvalid, c.ProbeShare)
	case c.ProbeAge < 0:
		return fmt.Errorf("%w: config probe age %v is negative", ErrInvalid, c.ProbeAge)
	case c.ProbeSamples < 0:
		return fmt.Errorf("%w: config probe samples %d is negative", ErrInvalid, c.ProbeSamples)
	case c.ProbeTokens < 0:
		return fmt.Errorf("%w: config probe tokens %d is negative", ErrInvalid, c.ProbeTokens)
	}
	return nil
}

// normalized applies the zero-value defaults and clamps what Validate would
// refuse, so NewModel never fails: a bad value must not stop dispatch.
func (c Config) normalized() Config {
	if c.Mode >= numModes {
		c.Mode = ModeCapacity
	}
	if c.SlowStart < 0 {
		c.SlowStart = 0
	}
	if math.IsNaN(c.SlowStartFloor) || c.SlowStartFloor < 0 {
		c.SlowStartFloor = 0
	} else if c.SlowStartFloor > 1 {
		c.SlowStartFloor = 1
	}
	if c.MissedHeartbeats <= 0 {
		c.MissedHeartbeats = DefaultMissedHeartbeats
	}
	c.PDThreshold = max(c.PDThreshold, 0)
	c.TimingMaxAge = max(c.TimingMaxAge, 0)
	if math.IsNaN(c.ProbeShare) || c.ProbeShare < 0 {
		c.ProbeShare = 0
	} else if c.ProbeShare > 1 {
		c.ProbeShare = 1
	}
	c.ProbeAge = max(c.ProbeAge, 0)
	c.ProbeSamples = max(c.ProbeSamples, 0)
	if c.ProbeTokens <= 0 {
		c.ProbeTokens = DefaultProbeTokens
	}
	return c
}
