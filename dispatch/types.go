package dispatch

import (
	"fmt"
	"strconv"
)

// Pool is the role an agent serves a model in. The names match the pool
// token of the job subjects (see package subjects).
type Pool uint8

const (
	PoolRegular Pool = iota // whole requests
	PoolPrefill             // the prefill leg of PD
	PoolDecode              // the decode leg of PD

	numPools = 3
)

var poolNames = [numPools]string{"regular", "prefill", "decode"}

func (p Pool) String() string {
	if p < numPools {
		return poolNames[p]
	}
	return "Pool(" + strconv.Itoa(int(p)) + ")"
}

// ParsePool parses "regular", "prefill" or "decode".
func ParsePool(s string) (Pool, error) {
	for i, n := range poolNames {
		if s == n {
			return Pool(i), nil
		}
	}
	return 0, fmt.Errorf("%w: pool %q (want regular, prefill or decode)", ErrInvalid, s)
}

// MarshalText implements encoding.TextMarshaler, so a Pool renders as its
// name in the JSON fleet view.
func (p Pool) MarshalText() ([]byte, error) {
	if p >= numPools {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, p)
	}
	return []byte(p.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParsePool.
func (p *Pool) UnmarshalText(b []byte) error {
	v, err := ParsePool(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// State is an agent's lifecycle state as its heartbeat reports it.
type State uint8

const (
	StateWarming  State = iota // engine not healthy yet, pulls no jobs: counts zero
	StateReady                 // pulls jobs: counts at its slow-start ramp
	StateDraining              // finishing in-flight work before exit: counts zero

	numStates = 3
)

var stateNames = [numStates]string{"warming", "ready", "draining"}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// ParseState parses "warming", "ready" or "draining".
func ParseState(s string) (State, error) {
	for i, n := range stateNames {
		if s == n {
			return State(i), nil
		}
	}
	return 0, fmt.Errorf("%w: state %q (want warming, ready or draining)", ErrInvalid, s)
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) {
	if s >= numStates {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, s)
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseState.
func (s *State) UnmarshalText(b []byte) error {
	v, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Route is the outcome of a decision: the regular queue, or the PD pipeline
// (the prefill queue of one pairing, whose agents hand the request on to the
// decode queue of the same pairing; see Decision).
type Route uint8

const (
	RouteRegular Route = iota
	RoutePD
)

func (r Route) String() string {
	switch r {
	case RouteRegular:
		return "regular"
	case RoutePD:
		return "pd"
	}
	return "Route(" + strconv.Itoa(int(r)) + ")"
}

// MarshalText implements encoding.TextMarshaler.
func (r Route) MarshalText() ([]byte, error) {
	if r > RoutePD {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, r)
	}
	return []byte(r.String()), nil
}

// Mode selects how route weights are computed; see the package doc.
type Mode uint8

const (
	// ModeCapacity weighs routes by free effective slots, in concurrent
	// requests: regular by its free slots, each PD pairing by the smaller of
	// its decode and prefill free slots (the default, and the zero value).
	ModeCapacity Mode = iota
	// ModePaired weighs regular by eligible agents and each PD pairing by
	// twice the smaller of its eligible prefill and decode counts.
	ModePaired
	// ModeCount is the SGLang reference gateway's rule: regular by eligible
	// agents, each PD pairing by its prefill plus decode agents. For
	// comparison only.
	ModeCount
	// ModeSLO chooses per request, among the routes with free capacity,
	// the one predicted to meet the request's latency targets (Need.Targets)
	// with the most headroom, from what the broker learned of each pool
	// (Agent.Timing); without targets, prompt length or history it weighs
	// as ModeCapacity. See the package doc.
	ModeSLO
	// ModeThreshold sends a request to PD when its prompt tokens not
	// cached on the regular pool exceed Config.PDThreshold, else to
	// regular (llm-d's PD decider), falling back to the other route when
	// the chosen one has no free capacity. For comparison.
	ModeThreshold

	numModes = 5
)

var modeNames = [numModes]string{"capacity", "paired", "count", "slo", "threshold"}

func (m Mode) String() string {
	if m < numModes {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode parses "capacity", "paired", "count", "slo" or "threshold".
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: mode %q (want capacity, paired, count, slo or threshold)", ErrInvalid, s)
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) {
	if m >= numModes {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, m)
	}
	return []byte(m.String()), nil
}

// capacityFree reports whether m weighs routes by free capacity, so that
// Decide asks InFlight: capacity itself, and slo and threshold, which keep
// it as their frame and their fall-back.
func (m Mode) capacityFree() bool { return m != ModePaired && m != ModeCount }

// UnmarshalText implements encoding.TextUnmarshaler with ParseMode.
func (m *Mode) UnmarshalText(b []byte) error {
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
