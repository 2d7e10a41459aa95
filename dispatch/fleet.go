package dispatch

import (
	"slices"
	"sync/atomic"
	"time"
)

// Fleet is an immutable set of model snapshots, the unit the broker swaps
// when heartbeats change.
type Fleet struct {
	models map[string]*Model
	names  []string // sorted; models with at least one eligible agent
}

// NewFleet builds one Model per entry of agents (keyed by model name) at
// time now. agents is not retained.
func NewFleet(agents map[string][]Agent, now time.Time, cfg Config) *Fleet {
	f := &Fleet{models: make(map[string]*Model, len(agents))}
	for name, as := range agents {
		m := NewModel(name, as, now, cfg)
		f.models[name] = m
		if m.anyEligible() {
			f.names = append(f.names, name)
		}
	}
	slices.Sort(f.names)
	return f
}

func (m *Model) anyEligible() bool {
	for _, p := range m.pools {
		if p.Eligible > 0 {
			return true
		}
	}
	return false
}

// Model returns the snapshot of name. It does not allocate, and a nil Fleet
// (a Table before its first Store) has no models.
func (f *Fleet) Model(name string) (*Model, bool) {
	if f == nil {
		return nil, false
	}
	m, ok := f.models[name]
	return m, ok
}

// Models returns the sorted names of the models with at least one eligible
// agent in any pool (what /v1/models lists). The list is computed once by
// NewFleet; the result is a copy.
func (f *Fleet) Models() []string {
	if f == nil {
		return nil
	}
	return slices.Clone(f.names)
}

// Table publishes the current Fleet to the request path without locks: one
// writer (the heartbeat consumer) Stores a new Fleet, any number of
// requests Load it. The zero value holds no Fleet.
type Table struct {
	p atomic.Pointer[Fleet]
}

// Load returns the current Fleet, nil before the first Store.
func (t *Table) Load() *Fleet { return t.p.Load() }

// Store publishes f; a Fleet must not be changed after it is stored.
func (t *Table) Store(f *Fleet) { t.p.Store(f) }

// AllModels returns the sorted names of every model in the fleet, eligible
// or not (what a fleet view shows).
func (f *Fleet) AllModels() []string {
	if f == nil {
		return nil
	}
	out := make([]string, 0, len(f.models))
	for name := range f.models {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// FleetOf returns the Fleet of models, built by NewModel (a later model
// of the same name wins): the broker rebuilds only the models whose agents
// changed and keeps the others' snapshots.
func FleetOf(models []*Model) *Fleet {
	f := &Fleet{models: make(map[string]*Model, len(models))}
	for _, m := range models {
		f.models[m.name] = m
	}
	for name, m := range f.models {
		if m.anyEligible() {
			f.names = append(f.names, name)
		}
	}
	slices.Sort(f.names)
	return f
}

// Fresh reports whether a model built at now counts a as heard: its last
// heartbeat is within cfg.MissedHeartbeats of its intervals.
func Fresh(a Agent, now time.Time, cfg Config) bool {
	return fresh(a, now, cfg.normalized().MissedHeartbeats)
}
