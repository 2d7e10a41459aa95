package affinity

import (
	"errors"
	"fmt"
)

// State is what an agent is doing, as the broker's capacity table knows it.
type State uint8

const (
	// Ready agents pull jobs; only they can be preferred.
	Ready State = iota
	// Draining agents finish what they hold and take nothing new.
	Draining
	// Stale agents missed their heartbeats: they may be dead.
	Stale
	// Warming agents' engines are not healthy yet.
	Warming
)

// Candidate is one agent of the pool, in plain values so that the broker
// can fill it from its snapshot and the tree's [Match].
type Candidate struct {
	Agent string
	State State
	// FreeSlots is the agent's free effective slots: effective slots (with
	// slow start) - active - offered and not yet taken.
	FreeSlots int
	// Load is the agent's requests in flight: active + offered and not yet
	// taken, in the unit of the [Guard]'s thresholds.
	Load int
	// Matched is how many leading blocks of the request's prompt the agent
	// holds ([Match.Blocks]; 0 when it has none).
	Matched int
	// Precise tells that Matched comes from the agent's engine events.
	Precise bool
}

// Guard bounds when the cache may outweigh the load, after the reference
// gateway's cache-aware policy: an agent is preferred only while it has a
// free effective slot and it is not imbalanced against the least loaded
// ready agent of the pool, imbalanced meaning
//
//	load - minLoad > BalanceAbs && load > minLoad * BalanceRel
//
// (the gateway's balance_abs_threshold and balance_rel_threshold).
type Guard struct {
	// MinBlocks is the shortest match worth a preference (default 1).
	MinBlocks int
	// BalanceAbs is the absolute load excess tolerated (requests).
	BalanceAbs int
	// BalanceRel is the load ratio tolerated (at least 1).
	BalanceRel float64
}

// DefaultGuard returns the defaults: a match of one block, and a preferred
// agent at most 2 requests or 1.5 times above the least loaded one.
func DefaultGuard() Guard {
	return Guard{MinBlocks: 1, BalanceAbs: 2, BalanceRel: 1.5}
}

// ErrInvalidGuard is returned by [Guard.Validate].
var ErrInvalidGuard = errors.New("affinity: invalid guard")

// Validate reports an out-of-range threshold.
func (g Guard) Validate() error {
	var errs []error
	if g.MinBlocks < 1 {
		errs = append(errs, fmt.Errorf("%w: min blocks must be at least 1, got %d", ErrInvalidGuard, g.MinBlocks))
	}
	if g.BalanceAbs < 0 {
		errs = append(errs, fmt.Errorf("%w: balance abs must not be negative, got %d", ErrInvalidGuard, g.BalanceAbs))
	}
	if g.BalanceRel < 1 {
		errs = append(errs, fmt.Errorf("%w: balance rel must be at least 1, got %g", ErrInvalidGuard, g.BalanceRel))
	}
	return errors.Join(errs...)
}

// Reason says why a [Decision] prefers an agent or not; the broker counts
// them per pool.
type Reason uint8

const (
	// NoMatch: no ready agent holds MinBlocks of the prompt.
	NoMatch Reason = iota
	// Affinity: the decision prefers an agent.
	Affinity
	// Full: the agents holding the prompt have no free effective slot.
	Full
	// Imbalanced: the agents holding the prompt with a free slot are
	// loaded beyond the guard.
	Imbalanced
)

var reasonNames = [...]string{NoMatch: "no_match", Affinity: "affinity", Full: "full", Imbalanced: "imbalanced"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the outcome of [Choose].
type Decision struct {
	// Index is the preferred candidate's index, or -1: no preference, the
	// job goes to the pool's shared queue.
	Index int
	// Blocks is the preferred agent's match.
	Blocks int
	// Reason is Affinity when Index >= 0, else why not.
	Reason Reason
}

// Choose picks the agent to offer a job to first: among ready candidates
// that hold at least g.MinBlocks of the prompt, have a free effective slot
// and pass the balance guard, the one with the longest match (ties: the
// precise match, then the lower load, then the first). When none
// qualifies the job has no preference, and the Reason is that of the
// longest-matched agent turned down. Draining, stale and warming agents
// are never preferred and do not count in the pool's least load. Choose
// is pure and does not allocate.
func Choose(cands []Candidate, g Guard) Decision {
	minBlocks := max(g.MinBlocks, 1)
	minLoad, seen := 0, false
	for i := range cands {
		if c := &cands[i]; c.State == Ready && (!seen || c.Load < minLoad) {
			minLoad, seen = c.Load, true
		}
	}
	d := Decision{Index: -1, Reason: NoMatch}
	rejected := 0 // the longest match turned down
	for i := range cands {
		c := &cands[i]
		if c.State != Ready || c.Matched < minBlocks {
			continue
		}
		var why Reason
		switch {
		case c.FreeSlots <= 0:
			why = Full
		case c.Load-minLoad > g.BalanceAbs && float64(c.Load) > float64(minLoad)*g.BalanceRel:
			why = Imbalanced
		default:
			if d.Index < 0 || better(c, &cands[d.Index]) {
				d.Index, d.Blocks = i, c.Matched
			}
			continue
		}
		if c.Matched > rejected {
			rejected, d.Reason = c.Matched, why
		}
	}
	if d.Index >= 0 {
		d.Reason = Affinity
	}
	return d
}

func better(c, best *Candidate) bool {
	if c.Matched != best.Matched {
		return c.Matched > best.Matched
	}
	if c.Precise != best.Precise {
		return c.Precise
	}
	return c.Load < best.Load
}
