package openaihttp

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/ingress/auth"
)

type fleetAgent struct {
	ID             string    `json:"id"`
	Model          string    `json:"model"`
	Pool           string    `json:"pool"`
	State          string    `json:"state"`
	Engine         string    `json:"engine,omitempty"`
	Transport      string    `json:"transport,omitempty"`
	Slots          int       `json:"slots"`
	Active         int       `json:"active"`
	EffectiveSlots float64   `json:"effective_slots"`
	Eligible       bool      `json:"eligible"`
	Reason         string    `json:"reason,omitempty"`
	PDProtocol     string    `json:"pd_protocol,omitempty"`
	Pairing        string    `json:"pairing,omitempty"`
	ReadySince     time.Time `json:"ready_since,omitzero"`
	LastHeartbeat  time.Time `json:"last_heartbeat"`
	// StateReason is the agent's own word on why it does not serve (its
	// heartbeat's state_reason), e.g. an engine that refuses its key.
	StateReason string `json:"state_reason,omitempty"`
}

// fleetPool is one pool (or one side of a pairing). Agents and Active
// count every agent in the table: Active is all the work the pool holds,
// a draining agent's streams and those of a decode agent whose prefill
// partner left included. Eligible, Slots, EffectiveSlots, EligibleActive
// and Free count the eligible agents only, as dispatch does: Free is
// EffectiveSlots less EligibleActive.
type fleetPool struct {
	Pool           string  `json:"pool"`
	Agents         int     `json:"agents"`
	Eligible       int     `json:"eligible"`
	Slots          int     `json:"slots"`
	EffectiveSlots float64 `json:"effective_slots"`
	Active         int     `json:"active"`
	EligibleActive int     `json:"eligible_active"`
	Free           float64 `json:"free"`
	// Batch is the pool's batch-class work: jobs waiting in its batch
	// queue, jobs its agents run (not counted in active: interactive work
	// takes their slots back), and the share of its slots they hold.
	Batch fleetBatch `json:"batch"`
	// Learned is the latency the broker learned of the pool's agents from
	// the chunks it relayed (absent until it has); SLO is how the requests
	// with latency targets on the pool's route fared (regular for the
	// regular pool, PD for prefill and decode).
	Learned *fleetTiming       `json:"learned,omitempty"`
	SLO     *broker.Attainment `json:"slo,omitempty"`
	// Predictions is how slo dispatch's recent predicted TTFTs on the
	// pool's route compared with the actual ones (absent until scored).
	Predictions *broker.PredictionStats `json:"predictions,omitempty"`
}

// fleetTiming is a pool's learned latency, the mean over its agents with
// figures (see dispatch.Timing for what each measures per pool).
type fleetTiming struct {
	Agents                 int     `json:"agents"`
	Samples                int     `json:"samples"`
	TTFTSeconds            float64 `json:"ttft_seconds"`
	ITLSeconds             float64 `json:"itl_seconds"`
	QueueWaitSeconds       float64 `json:"queue_wait_seconds"`
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
	OutputTokens           float64 `json:"output_tokens"`
	// CacheUnreported counts the agents whose engines report no cached
	// prompt tokens (usage.prompt_tokens_details.cached_tokens): what they
	// prefilled is not known, so no prefill rate is learned of them, and
	// a route with no rate is decided by capacity (PrefillLearning says
	// which).
	CacheUnreported int `json:"cache_unreported_agents,omitempty"`
	// PrefillLearning is "engine-reported" when the pool's prefill rate
	// comes from the prompt tokens its engines reported prefilling, or
	// "unreported: decided by capacity" when none of them reports.
	PrefillLearning string `json:"prefill_learning,omitempty"`
}

// sloBackend is what a backend that counts latency-target attainment
// adds (the broker does).
type sloBackend interface {
	SLOAttainment(model string, route dispatch.Route) broker.Attainment
}

// predictionBackend is what a backend that scores slo's predictions adds
// (the broker does).
type predictionBackend interface {
	SLOPredictions(model string, route dispatch.Route) (broker.PredictionStats, bool)
}

// sloGuardHolds is fleetModel.SLOGuard's value while the guard holds.
const sloGuardHolds = "predictions_off: deciding by capacity"

// addTiming sets the learned figures and the attainment of the model's
// pools in fm.
func (s *Server) addTiming(fm *fleetModel, m *dispatch.Model) {
	learned := broker.PoolTimings(m)
	sb, _ := s.backend.(sloBackend)
	pb, _ := s.backend.(predictionBackend)
	for i := range fm.Pools {
		p := &fm.Pools[i]
		pool, err := dispatch.ParsePool(p.Pool)
		if err != nil {
			continue
		}
		if t := learned[pool]; t.Agents > 0 {
			p.Learned = &fleetTiming{Agents: t.Agents, Samples: t.Samples, TTFTSeconds: t.TTFT.Seconds(), ITLSeconds: t.ITL.Seconds(),
				QueueWaitSeconds: t.QueueWait.Seconds(), PrefillTokensPerSecond: t.PrefillRate, OutputTokens: t.OutputTokens,
				CacheUnreported: t.CacheUnreported}
			switch {
			case pool == dispatch.PoolDecode:
			case t.PrefillRate > 0:
				p.Learned.PrefillLearning = "engine-reported"
			case t.CacheUnreported > 0:
				p.Learned.PrefillLearning = "unreported: decided by capacity"
			}
		}
		route := dispatch.RoutePD
		if pool == dispatch.PoolRegular {
			route = dispatch.RouteRegular
		}
		if pb != nil {
			ps, off := pb.SLOPredictions(fm.Model, route)
			if ps.Samples > 0 || ps.Probes > 0 {
				p.Predictions = &ps
			}
			if off && m.Mode() == dispatch.ModeSLO {
				fm.SLOGuard = sloGuardHolds
			}
		}
		if sb == nil {
			continue
		}
		if a := sb.SLOAttainment(fm.Model, route); a.Met+a.Missed > 0 {
			p.SLO = &a
		}
	}
}

type fleetModel struct {
	Model string `json:"model"`
	Mode  string `json:"mode"`
	// Weights are the live weights of the next decision: heartbeats less
	// the jobs this broker sent that they do not show yet.
	Weights map[string]float64 `json:"weights"`
	// Share is each route's fraction of the weight: where the next request
	// goes, in probability.
	Share map[string]float64 `json:"share"`
	// Saturated: every route is full and weights fall back to capacity.
	Saturated bool           `json:"saturated"`
	Pools     []fleetPool    `json:"pools"`
	Pairings  []fleetPair    `json:"pairings"`
	Recent    fleetRecent    `json:"recent"`
	Queue     map[string]int `json:"queue"`
	// Affinity is prefix-cache affinity per pool where it applies
	// (regular, prefill): the share of requests offered to the agent
	// caching their prefix, the fallbacks by reason, and the hit rate the
	// pool's engines report.
	Affinity map[string]broker.AffinityStats `json:"affinity"`
	// SLOGuard is set while slo dispatch's recent predictions are off
	// beyond its guard's bound (a route's median relative TTFT error over
	// 0.5): the model's requests are decided by capacity meanwhile.
	SLOGuard string `json:"slo_guard,omitempty"`
}

// fleetPair is one PD pairing: the prefill and decode agents that can hand
// off to each other (same PD protocol and declared labels).
type fleetPair struct {
	Pairing  string    `json:"pairing"`
	Eligible bool      `json:"eligible"`
	Weight   float64   `json:"weight"`
	Prefill  fleetPool `json:"prefill"`
	Decode   fleetPool `json:"decode"`
}

// fleetRecent is the route split of the requests started recently.
type fleetRecent struct {
	WindowSeconds float64 `json:"window_seconds"`
	Regular       int64   `json:"regular"`
	PD            int64   `json:"pd"`
}

type fleetView struct {
	At time.Time `json:"at"`
	// NotReady is "" while this broker takes requests, else why not: NATS
	// unreachable in the server's own words, shutting down, or listening
	// for heartbeats with no ready agent heard yet.
	NotReady string       `json:"not_ready,omitempty"`
	Models   []fleetModel `json:"models"`
	Agents   []fleetAgent `json:"agents"`
	// Pending are the agents whose engine has not named its model yet
	// (started without --model, the engine loading): in no model.
	Pending []broker.PendingAgent `json:"pending"`
	// Batches are the batches in flight (absent without the Batches API,
	// or while its store cannot be read).
	Batches *batch.Fleet `json:"batches,omitempty"`
	// BatchesError says why Batches is absent when the Batches API is on
	// but its store did not answer in time.
	BatchesError string `json:"batches_error,omitempty"`
}

func poolView(ps broker.PoolStats) fleetPool {
	return fleetPool{Pool: ps.Pool.String(), Agents: ps.Agents, Eligible: ps.Eligible, Slots: ps.Slots, EffectiveSlots: ps.EffectiveSlots, Active: ps.Active, EligibleActive: ps.EligibleActive, Free: ps.Free,
		Batch: fleetBatch{Running: ps.Batch, SlotShare: broker.BatchSlotShare(ps)}}
}

// fleetBatchWait bounds how long /v1/fleet waits for the batches' store.
const fleetBatchWait = 2 * time.Second

// fleetBatch is a pool's batch-class work (see fleetPool.Batch).
type fleetBatch struct {
	Queued    int     `json:"queued"`
	Running   int     `json:"running"`
	SlotShare float64 `json:"slot_share"`
}

// batchDepth is the batch queues' depths of a backend that reads them.
type batchDepth interface {
	BatchQueueDepth() map[string]map[string]int
}

// recentWindow is the span of the fleet view's recent route split.
const recentWindow = 10 * time.Second

// fleet serves GET /v1/fleet: the capacity table as the dispatcher sees it.
func (s *Server) fleet(w http.ResponseWriter, r *http.Request) {
	f := s.backend.Fleet()
	hbs := s.backend.Heartbeats()
	engines := make(map[[2]string][3]string, len(hbs))
	for _, hb := range hbs {
		engines[[2]string{hb.GetModel(), hb.GetAgentId()}] = [3]string{hb.GetEngine(), hb.GetTransport(), hb.GetStateReason()}
	}
	view := fleetView{At: time.Now().UTC(), Models: []fleetModel{}, Agents: []fleetAgent{}, Pending: s.backend.Pending()}
	if err := s.backend.Ready(); err != nil {
		view.NotReady = err.Error()
	}
	depth := s.backend.QueueDepth()
	for _, name := range f.AllModels() {
		m, _ := f.Model(name)
		reg, pairs, saturated := m.LiveWeights(s.backend.InFlight(name))
		var pd float64
		fm := fleetModel{Model: name, Mode: m.Mode().String(), Saturated: saturated, Pairings: []fleetPair{}}
		for _, p := range pairs {
			pd += p.Weight
			fm.Pairings = append(fm.Pairings, fleetPair{Pairing: p.Key, Eligible: p.Eligible, Weight: p.Weight, Prefill: poolView(p.Prefill), Decode: poolView(p.Decode)})
		}
		fm.Weights = map[string]float64{"regular": reg, "pd": pd}
		fm.Share = map[string]float64{"regular": 0, "pd": 0}
		if sum := reg + pd; sum > 0 {
			fm.Share["regular"], fm.Share["pd"] = reg/sum, pd/sum
		}
		rr := s.backend.RecentRoutes(name, recentWindow)
		fm.Recent = fleetRecent{WindowSeconds: rr.Window.Seconds(), Regular: rr.Regular, PD: rr.PD}
		fm.Queue = map[string]int{"regular": 0, "prefill": 0, "decode": 0}
		for pool, n := range depth[name] {
			fm.Queue[pool] = n
		}
		fm.Affinity = map[string]broker.AffinityStats{}
		var bdepth map[string]int
		if bd, ok := s.backend.(batchDepth); ok {
			bdepth = bd.BatchQueueDepth()[name]
		}
		for _, ps := range m.Pools() {
			pv := poolView(ps)
			pv.Batch.Queued = bdepth[pv.Pool]
			fm.Pools = append(fm.Pools, pv)
			if p := ps.Pool.String(); p != "decode" && ps.Agents > 0 {
				fm.Affinity[p] = s.backend.Affinity(name, p)
			}
		}
		s.addTiming(&fm, m)
		view.Models = append(view.Models, fm)
		for _, a := range m.Agents() {
			e := engines[[2]string{name, a.ID}]
			view.Agents = append(view.Agents, fleetAgent{
				ID: a.ID, Model: name, Pool: a.Pool.String(), State: a.State.String(),
				Engine: e[0], Transport: e[1], Slots: a.Slots, Active: a.Active,
				EffectiveSlots: a.EffectiveSlots, Eligible: a.Eligible, Reason: a.Reason, StateReason: e[2],
				PDProtocol: a.PDProtocol, Pairing: a.Pair,
				ReadySince: a.ReadySince.UTC(), LastHeartbeat: a.LastSeen.UTC(),
			})
		}
	}
	sort.Slice(view.Agents, func(i, j int) bool {
		a, b := view.Agents[i], view.Agents[j]
		if a.Model != b.Model {
			return a.Model < b.Model
		}
		if a.Pool != b.Pool {
			return a.Pool < b.Pool
		}
		return a.ID < b.ID
	})
	if s.cfg.Batch != nil {
		// The fleet is watched while NATS is in trouble too: its batches
		// wait for JetStream briefly, and their absence says why.
		ctx, cancel := context.WithTimeout(r.Context(), fleetBatchWait)
		var err error
		if view.Batches, err = s.cfg.Batch.Fleet(ctx, auth.Owner(r.Context())); err != nil {
			view.BatchesError = err.Error()
		}
		cancel()
	}
	writeJSON(w, http.StatusOK, view)
}
