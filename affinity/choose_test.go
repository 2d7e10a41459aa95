package affinity

import (
	"errors"
	"testing"
)

func TestChoose(t *testing.T) {
	g := Guard{MinBlocks: 2, BalanceAbs: 2, BalanceRel: 1.5}
	tests := []struct {
		name   string
		cands  []Candidate
		index  int
		reason Reason
	}{
		{
			name:   "no candidates",
			index:  -1,
			reason: NoMatch,
		},
		{
			name: "no match",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4},
				{Agent: "b", FreeSlots: 4},
			},
			index: -1, reason: NoMatch,
		},
		{
			name: "match below min blocks",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4, Matched: 1},
			},
			index: -1, reason: NoMatch,
		},
		{
			name: "longest match wins",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4, Matched: 3},
				{Agent: "b", FreeSlots: 4, Matched: 7},
				{Agent: "c", FreeSlots: 4, Matched: 5},
			},
			index: 1, reason: Affinity,
		},
		{
			name: "full agent falls back to shorter match",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4, Matched: 3},
				{Agent: "b", FreeSlots: 0, Load: 8, Matched: 7},
			},
			index: 0, reason: Affinity,
		},
		{
			name: "only matched agent full: shared queue",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4},
				{Agent: "b", FreeSlots: 0, Load: 2, Matched: 7},
			},
			index: -1, reason: Full,
		},
		{
			name: "imbalanced: abs and rel both exceeded",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 8, Load: 1},
				{Agent: "b", FreeSlots: 4, Load: 4, Matched: 7},
			},
			index: -1, reason: Imbalanced,
		},
		{
			name: "within abs bound",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 8, Load: 1},
				{Agent: "b", FreeSlots: 4, Load: 3, Matched: 7},
			},
			index: 1, reason: Affinity,
		},
		{
			name: "within rel bound on a loaded pool",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 8, Load: 20},
				{Agent: "b", FreeSlots: 4, Load: 29, Matched: 7},
			},
			index: 1, reason: Affinity,
		},
		{
			name: "draining agent never preferred",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4},
				{Agent: "b", State: Draining, FreeSlots: 4, Matched: 9},
			},
			index: -1, reason: NoMatch,
		},
		{
			name: "stale agent never preferred",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4, Matched: 2},
				{Agent: "b", State: Stale, FreeSlots: 4, Matched: 9},
			},
			index: 0, reason: Affinity,
		},
		{
			name: "warming agent never preferred",
			cands: []Candidate{
				{Agent: "b", State: Warming, FreeSlots: 4, Matched: 9},
			},
			index: -1, reason: NoMatch,
		},
		{
			name: "idle draining agent does not set the pool's least load",
			cands: []Candidate{
				{Agent: "a", State: Draining, Load: 0},
				{Agent: "b", FreeSlots: 2, Load: 6, Matched: 3},
				{Agent: "c", FreeSlots: 4, Load: 5},
			},
			index: 1, reason: Affinity,
		},
		{
			name: "tie: precise first",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4, Matched: 5},
				{Agent: "b", FreeSlots: 4, Matched: 5, Precise: true},
			},
			index: 1, reason: Affinity,
		},
		{
			name: "tie: lower load",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 4, Load: 2, Matched: 5},
				{Agent: "b", FreeSlots: 4, Load: 1, Matched: 5},
			},
			index: 1, reason: Affinity,
		},
		{
			name: "reason is the longest rejected",
			cands: []Candidate{
				{Agent: "a", FreeSlots: 8, Load: 0},
				{Agent: "b", FreeSlots: 0, Load: 3, Matched: 4},
				{Agent: "c", FreeSlots: 2, Load: 9, Matched: 6},
			},
			index: -1, reason: Imbalanced,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Choose(tt.cands, g)
			if d.Index != tt.index || d.Reason != tt.reason {
				t.Fatalf("Choose = %+v (%v), want index %d reason %v", d, d.Reason, tt.index, tt.reason)
			}
			if d.Index >= 0 && d.Blocks != tt.cands[d.Index].Matched {
				t.Errorf("Blocks = %d, want %d", d.Blocks, tt.cands[d.Index].Matched)
			}
		})
	}
}

func TestGuardValidate(t *testing.T) {
	if err := DefaultGuard().Validate(); err != nil {
		t.Fatal(err)
	}
	err := Guard{MinBlocks: 0, BalanceAbs: -1, BalanceRel: 0.5}.Validate()
	if !errors.Is(err, ErrInvalidGuard) {
		t.Fatalf("Validate = %v, want ErrInvalidGuard", err)
	}
}
