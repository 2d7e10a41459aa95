package broker

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-ai/switchyard/dispatch"
	"github.com/switchyard-ai/switchyard/subjects"
	"github.com/switchyard-ai/switchyard/wire"
)

// Broker routes requests to agents over NATS. Create it with New, start it
// with Run, and submit requests with Submit once Run is going.
type Broker struct {
	cfg  Config
	log  *slog.Logger
	rand func() uint64
	now  func() time.Time
	nc   *nats.Conn
	js   jetstream.JetStream
	subj subjects.Builder
	// connWhy says why NATS is not connected (WithConnStatus); may be nil.
	connWhy func() error

	table   dispatch.Table
	started atomic.Int64 // unix nanos when Run subscribed; 0 before
	closing atomic.Bool  // StopAccepting was called
	// reconnected is when the connection last came back, or the broker
	// was last found paused (unix nanos; 0: never): chunks sent meanwhile
	// may be lost, heartbeats unread.
	reconnected atomic.Int64

	mu     sync.Mutex // guards agents, fleet, known, poolsHeard, pending, deaf and lastRebuild
	agents map[agentKey]*agentEntry
	fleet  fleetState           // what rebuild keeps between snapshots (fleetstate.go)
	known  map[string]time.Time // model -> last heartbeat of any agent
	// poolsHeard: (model, pool) -> last heartbeat of any agent in it.
	poolsHeard map[modelPool]time.Time
	// pending: agents whose engine has not named its model yet, by id.
	pending map[string]PendingAgent
	deaf    bool // the last rebuild found NATS unreachable
	// lastRebuild is when rebuild last ran (see rebuildLate).
	lastRebuild time.Time
	dirty       chan struct{}
	// pauses measures the broker's own pauses, which the stall timer
	// leaves out of an attempt's silence.
	pauses *pauseWatch

	calls sync.Map // request id -> *Call
	// chunkPool holds decoded chunks their readers gave back (*wire.Chunk):
	// the reply goroutine decodes into them (see onChunk).
	chunkPool sync.Pool
	// orphans: requests no longer in flight whose chunks came, and when
	// they were last cancelled for it (see cancelOrphan).
	orphanMu sync.Mutex
	orphans  map[string]time.Time
	nextReq  atomic.Uint64

	jobSubj     sync.Map // jobsKey -> subject, built once per (model, pool)
	batchSubj   sync.Map // jobsKey -> batch-class subject (see classSubject)
	replyChunks string   // the one reply subject of every job (subjects.ReplyChunks)

	metrics  *Metrics
	routeObs routeObsCache // per (model, route) metric children
	routes   sync.Map      // model -> *routeStats
	depth    atomic.Pointer[depthReading]
	stream   atomic.Pointer[jetstream.Stream] // the jobs stream, once EnsureStream made it
	health   streamHealth                     // whether the stream takes jobs (streamhealth.go)
	directed directedStream                   // the directed queues' stream (directed.go)
	flight   inFlight                         // jobs dispatched and not yet ended, per queue
	waits    capacityWaits                    // requests waiting for capacity (scaling.go)
	aff      affinityState                    // prefix-cache affinity (affinity.go)
	timing   timings                          // latency learned per agent (timing.go)
	guard    sloGuard                         // slo's predictions scored (sloguard.go)
	// jobDeletes tracks deletions of abandoned jobs in the background.
	jobDeletes sync.WaitGroup

	// publishTimeout bounds a JetStream call (a job's publish, a stream
	// check) whose context has no deadline, so a request never waits long
	// on a NATS that went away between the connected check and the publish.
	publishTimeout time.Duration
}

type agentKey struct{ model, id string }

type agentEntry struct {
	agent   dispatch.Agent
	hb      *wire.Heartbeat
	counted counted // what the model's snapshot counts (fleetstate.go)
}

type jobsKey struct{ model, pool, pair string }

// New returns a broker using nc, which the caller owns and closes.
func New(nc *nats.Conn, cfg Config, opts ...Option) (*Broker, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("broker config: %w", err)
	}
	b := &Broker{
		cfg:            cfg,
		log:            slog.Default(),
		rand:           rand.Uint64,
		now:            time.Now,
		nc:             nc,
		subj:           subjects.Must(cfg.Prefix),
		agents:         make(map[agentKey]*agentEntry),
		known:          make(map[string]time.Time),
		poolsHeard:     make(map[modelPool]time.Time),
		pending:        make(map[string]PendingAgent),
		dirty:          make(chan struct{}, 1),
		publishTimeout: DefaultPublishTimeout,
	}
	for _, o := range opts {
		o(b)
	}
	var err error
	if b.replyChunks, err = b.subj.ReplyChunks(cfg.ID); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(b.publishTimeout))
	if err != nil {
		return nil, fmt.Errorf("broker: jetstream: %w", err)
	}
	b.js = js
	if b.metrics == nil {
		b.metrics = NewMetrics()
	}
	// Pauses are real time, whatever clock the table is judged by.
	b.pauses = newPauseWatch(time.Now)
	b.table.Store(dispatch.NewFleet(nil, b.now(), cfg.Dispatch))
	return b, nil
}

// ID returns the broker's id.
func (b *Broker) ID() string { return b.cfg.ID }

// Config returns the configuration in force, defaults applied.
func (b *Broker) Config() Config { return b.cfg }

// DefaultPublishTimeout is the bound of a JetStream call without a
// deadline of its own (see WithPublishTimeout).
const DefaultPublishTimeout = 2 * time.Second

// WithPublishTimeout bounds one JetStream call: one try of a job's
// publish (a try sent to a node that died is given up for the next, see
// Config.PublishWait for the bound of all tries) and the broker's stream
// checks.
func WithPublishTimeout(d time.Duration) Option {
	return func(b *Broker) {
		if d > 0 {
			b.publishTimeout = d
		}
	}
}

// streamCheckInterval is how often the broker checks that the jobs stream
// still exists (a NATS server restarted on an empty store, a stream
// deleted by hand); it also checks at every reconnect.
const streamCheckInterval = time.Second

// EnsureStream creates or updates the jobs stream. It is idempotent, so every
// broker of a fleet calls it at start, and again whenever it finds the
// stream gone.
func (b *Broker) EnsureStream(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		// Creating a replicated stream waits for its peers: allow more than
		// a publish.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*b.publishTimeout)
		defer cancel()
	}
	maxAge := b.cfg.RequestTimeout + time.Minute
	cfg := jetstream.StreamConfig{
		Name:                 b.cfg.Stream,
		Description:          "Switchyard jobs, one subject per model and pool",
		Subjects:             []string{b.subj.JobsAll()},
		Retention:            jetstream.WorkQueuePolicy,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    int64(b.cfg.QueueMax),
		MaxAge:               maxAge,
		Duplicates:           min(b.dupWindow(), maxAge),
		Storage:              b.storage(),
		Replicas:             b.cfg.Replicas,
	}
	st, err := b.js.CreateOrUpdateStream(ctx, cfg)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return err
	}
	if err != nil {
		// JetStream cannot change the storage of a stream: one created
		// with the other storage keeps it (delete the stream, which holds
		// only jobs in flight, to change it).
		if found, serr := b.js.Stream(ctx, b.cfg.Stream); serr == nil && found.CachedInfo().Config.Storage != cfg.Storage {
			b.log.Warn("jobs stream keeps the storage it was created with; docs/operations.md says how to change it", "stream", b.cfg.Stream,
				"storage", found.CachedInfo().Config.Storage.String(), "wanted", cfg.Storage.String())
			cfg.Storage = found.CachedInfo().Config.Storage
			st, err = b.js.CreateOrUpdateStream(ctx, cfg)
		}
	}
	if err != nil {
		err = b.explainJS(err)
		b.noteCreate(err)
		return fmt.Errorf("broker: stream %s: %w", b.cfg.Stream, err)
	}
	b.stream.Store(&st)
	b.noteCreate(nil)
	b.noteInfo(st.CachedInfo(), nil)
	b.startDirected(ctx)
	return nil
}

// dupWindow is how long the jobs stream remembers a job's message id
// (Nats-Msg-Id): every try of one publish, the broker's (within
// PublishWait) and a prefill agent's decode job (within its KV hold), with
// the last try's own timeout on top. JetStream's default of two minutes
// would keep every job's id that long: a heap that grows with the request
// rate times two minutes, all of it marked by every collection, for ids
// no try can repeat.
func (b *Broker) dupWindow() time.Duration {
	return max(b.cfg.PublishWait, b.cfg.KVHold) + 2*b.publishTimeout
}

func (b *Broker) storage() jetstream.StorageType {
	if b.cfg.FileStorage {
		return jetstream.FileStorage
	}
	return jetstream.MemoryStorage
}

// Run subscribes to heartbeats and replies, keeps the capacity table fresh,
// and returns when ctx ends. The stream is created first, retrying while
// NATS is unreachable.
func (b *Broker) Run(ctx context.Context) error {
	for {
		err := b.EnsureStream(ctx)
		if err == nil {
			break
		}
		b.log.Debug("jobs stream not ready, retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	replySub, err := b.nc.Subscribe(b.replyChunks, b.onReply)
	if err != nil {
		return fmt.Errorf("broker: subscribe %s: %w", b.replyChunks, err)
	}
	defer func() { _ = replySub.Unsubscribe() }()
	// Replies are the token path: let them queue deep rather than be dropped
	// as a slow consumer; per-request bounds are enforced in Call.
	_ = replySub.SetPendingLimits(1<<20, 1<<30)
	stopHeartbeats, err := b.subscribeHeartbeats(ctx)
	if err != nil {
		return err
	}
	defer stopHeartbeats()
	stopAffinity, err := b.startAffinity()
	if err != nil {
		return err
	}
	defer stopAffinity()
	if err := b.nc.FlushTimeout(b.publishTimeout); err != nil {
		// NATS went away again: the subscriptions are sent at reconnect.
		b.log.Warn("broker: subscriptions not confirmed yet", "err", err)
	}
	// A stream the servers cannot store in (a memory stream where
	// max_memory_store is 0) is created all the same: one write says so
	// before the broker says it is ready.
	b.probeWrite(ctx)
	b.started.Store(b.now().UnixNano())
	b.log.Info("broker running", "id", b.cfg.ID, "stream", b.cfg.Stream, "prefix", b.cfg.Prefix)

	pausesDone := make(chan struct{})
	defer func() { <-pausesDone }()
	go func() {
		defer close(pausesDone)
		b.pauses.run(ctx)
	}()
	keeperDone := make(chan struct{})
	defer func() { <-keeperDone }()
	go func() {
		defer close(keeperDone)
		b.keepStream(ctx)
	}()
	directedDone := make(chan struct{})
	defer func() { <-directedDone }()
	go func() {
		defer close(directedDone)
		b.keepDirected(ctx)
	}()
	deafDone := make(chan struct{})
	defer func() { <-deafDone }()
	go func() {
		defer close(deafDone)
		b.watchDeaf(ctx)
	}()

	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			b.pollDepth(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	tick := time.NewTicker(rebuildEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-b.dirty:
			// Coalesce bursts of heartbeats into one rebuild.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(10 * time.Millisecond):
			}
		}
		b.rebuild()
	}
}

// keepStream recreates the jobs stream when it is gone: checked at every
// reconnect (the server may have restarted on an empty store, or the
// connection moved to another cluster) and every streamCheckInterval.
// Subscriptions need no such care: nats.go renews them on reconnect.
func (b *Broker) keepStream(ctx context.Context) {
	status := b.nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED)
	defer b.nc.RemoveStatusListener(status)
	t := time.NewTicker(streamCheckInterval)
	defer t.Stop()
	for {
		reconnected := false
		select {
		case <-ctx.Done():
			return
		case st := <-status:
			if st != nats.CONNECTED {
				continue
			}
			reconnected = true
		case <-t.C:
		}
		if err := b.repairStream(ctx, reconnected); err != nil && ctx.Err() == nil {
			b.log.Warn("jobs stream check failed, retrying", "stream", b.cfg.Stream, "err", err)
		}
	}
}

// watchDeaf marks the broker deaf the moment its connection drops, and
// again when it is back: heartbeats were missed because the broker could
// not hear them, and a blip shorter than a rebuild tick would otherwise go
// unnoticed by rebuild. It does nothing else, so no slow JetStream call
// (keepStream's, during a leader election) delays it. The mark at the
// reconnect covers the time until the subscriptions are renewed on the new
// node and agents on the lost node have reconnected too.
func (b *Broker) watchDeaf(ctx context.Context) {
	status := b.nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED)
	defer b.nc.RemoveStatusListener(status)
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-status:
			b.mu.Lock()
			b.deaf = true
			b.mu.Unlock()
			if st == nats.CONNECTED {
				b.reconnected.Store(b.now().UnixNano())
			}
		}
	}
}

// repairStream makes sure the jobs stream exists; after a reconnect it
// re-applies the configuration even if the stream is there (idempotent).
func (b *Broker) repairStream(ctx context.Context, reconnected bool) error {
	if !b.nc.IsConnected() {
		return nil
	}
	b.health.mu.Lock()
	createFailed := b.health.create != nil
	b.health.mu.Unlock()
	if !reconnected && !createFailed {
		sctx, cancel := context.WithTimeout(ctx, b.publishTimeout)
		st, err := b.js.Stream(sctx, b.cfg.Stream)
		cancel()
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			// There, or not answerable now: check again later.
			if err != nil {
				b.noteInfo(nil, b.explainJS(err))
				return nil
			}
			b.noteInfo(st.CachedInfo(), nil)
			if b.writeRefused() {
				b.probeWrite(ctx)
			}
			return nil
		}
		b.log.Warn("jobs stream missing, recreating it", "stream", b.cfg.Stream)
		// What the servers refused concerned the stream that is gone.
		b.health.mu.Lock()
		b.health.write = nil
		b.health.mu.Unlock()
	}
	if err := b.EnsureStream(ctx); err != nil {
		return err
	}
	if !reconnected && !createFailed {
		b.log.Info("jobs stream recreated", "stream", b.cfg.Stream)
	}
	if b.writeRefused() {
		b.probeWrite(ctx)
	}
	return nil
}

// EndCalls ends every call in flight with err (ErrShutdown, at the end of
// a shutdown's grace): each reader returns it from Next, so its client gets
// one clear error rather than a cut connection. It returns how many calls
// it ended.
func (b *Broker) EndCalls(err error) int {
	n := 0
	b.calls.Range(func(_, v any) bool {
		v.(*Call).fail(err)
		n++
		return true
	})
	return n
}

// StopAccepting makes Submit refuse new requests (ErrClosed) and Ready
// report not ready, while calls in flight go on: the first step of a
// graceful shutdown, so load balancers stop sending before streams end.
func (b *Broker) StopAccepting() { b.closing.Store(true) }

// ConnErr returns nil while the broker is connected to NATS, else an error
// that is ErrNotConnected and says why, when the broker was told
// (WithConnStatus).
func (b *Broker) ConnErr() error {
	if b.nc.IsConnected() {
		return nil
	}
	if b.connWhy != nil {
		if why := b.connWhy(); why != nil {
			return fmt.Errorf("%w: %w", ErrNotConnected, why)
		}
	}
	return ErrNotConnected
}

// Ready reports whether the broker can take requests: connected to NATS,
// subscribed, and either some agent is eligible (a request can be
// dispatched) or it has listened for a heartbeat interval, long enough to
// have heard every agent once: from then on an empty fleet is the fleet's
// state, not the broker's, and a request gets the dispatch rule's answer.
// While neither holds it says it is listening for heartbeats.
func (b *Broker) Ready() error {
	if b.closing.Load() {
		return ErrClosed
	}
	if err := b.ConnErr(); err != nil {
		return err
	}
	if err := b.streamProblem(); err != nil {
		return err
	}
	st := b.started.Load()
	if st == 0 {
		return errors.New("broker not started")
	}
	if heard := b.now().Sub(time.Unix(0, st)); heard < b.cfg.HeartbeatInterval && len(b.table.Load().Models()) == 0 {
		return fmt.Errorf("listening for heartbeats: no ready agent heard yet (%s of %s)", heard.Round(time.Millisecond), b.cfg.HeartbeatInterval)
	}
	return nil
}

func (b *Broker) onHeartbeat(m *nats.Msg) {
	key, err := b.subj.ParseHeartbeat(m.Subject)
	if err != nil {
		b.log.Debug("bad heartbeat subject", "subject", m.Subject, "err", err)
		return
	}
	hb, err := wire.UnmarshalHeartbeat(m.Data)
	if err != nil {
		b.log.Debug("bad heartbeat", "subject", m.Subject, "err", err)
		return
	}
	if key.Model == wire.ModelPending {
		b.notePending(key.Agent, key.Pool, hb)
		return
	}
	if hb.GetState() == wire.StateStopped {
		b.forgetAgent(agentKey{key.Model, key.Agent})
		return
	}
	pool, err := dispatch.ParsePool(key.Pool)
	if err != nil {
		return
	}
	state, err := dispatch.ParseState(hb.GetState())
	if err != nil {
		b.log.Debug("bad heartbeat state", "subject", m.Subject, "state", hb.GetState())
		return
	}
	now := b.now()
	a := dispatch.Agent{
		ID:    key.Agent,
		Pool:  pool,
		State: state,
		Slots: int(hb.GetSlots()),
		// Batch jobs are the agent's to give back (batch_active): free
		// capacity to interactive dispatch.
		Active:      max(int(hb.GetActive())-int(hb.GetBatchActive()), 0),
		Batch:       int(hb.GetBatchActive()),
		LastSeen:    now,
		Interval:    hb.GetInterval().AsDuration(),
		PullLimit:   int(hb.GetPullLimit()),
		PDProtocol:  hb.GetPdProtocol(),
		PDLabels:    hb.GetPdLabels(),
		StateReason: hb.GetStateReason(),
	}
	if hb.GetReadySince() != nil {
		a.ReadySince = hb.GetReadySince().AsTime()
	}
	a.EngineWaiting = int(hb.GetEngineWaiting())
	b.mu.Lock()
	k := agentKey{key.Model, key.Agent}
	e := b.agents[k]
	// An agent heard again after a silence of more than one interval and a
	// half may be stale in the snapshot (a NATS failover, a pause of the
	// broker): rebuild now rather than at the next tick.
	changed := e == nil || agentChanged(&e.agent, &a) || (a.Interval > 0 && now.Sub(e.agent.LastSeen) > a.Interval*3/2)
	if e == nil {
		e = &agentEntry{}
		b.agents[k] = e
	}
	// Folded into the entry: a heartbeat that changes nothing the snapshot
	// shows costs no rebuild.
	e.agent, e.hb = a, hb
	if changed {
		b.markDirty(key.Model)
	}
	b.known[key.Model] = now
	b.poolsHeard[modelPool{key.Model, key.Pool}] = now
	b.mu.Unlock()
	if changed {
		select {
		case b.dirty <- struct{}{}:
		default:
		}
	}
}

// forgetAgent takes an agent that said goodbye (its last heartbeat, state
// stopped) out of the capacity table at the next rebuild, which it asks
// for now. Its model stays known: it may come back.
func (b *Broker) forgetAgent(k agentKey) {
	b.mu.Lock()
	_, ok := b.agents[k]
	delete(b.agents, k)
	if ok {
		b.markDirty(k.model)
	}
	b.mu.Unlock()
	if !ok {
		return
	}
	b.log.Info("agent left", "model", k.model, "agent", k.id)
	select {
	case b.dirty <- struct{}{}:
	default:
	}
}

// rebuildEvery is the capacity table's rebuild tick (heartbeats that
// change an agent rebuild it sooner); a rebuild more than rebuildLate
// after the previous one shows that the broker was paused: two ticks
// missed.
const (
	rebuildEvery = 250 * time.Millisecond
	rebuildLate  = 2 * rebuildEvery
)

// forgetAfter is how long an agent stays in the table (as not eligible)
// after its last heartbeat, and a model stays known (404 versus 503).
const forgetAfter = 5 * time.Minute

// rebuild makes a new capacity snapshot. While the broker itself is cut
// off from NATS it keeps the last one: agents' heartbeats are missing
// because the broker is deaf, not because the agents died, and calls in
// flight must not abandon their attempts for that. After a reconnect every
// agent gets a fresh grace of missed intervals before it counts as gone.
func (b *Broker) rebuild() {
	b.fleet.building.Lock()
	defer b.fleet.building.Unlock()
	now := b.now()
	if !b.nc.IsConnected() {
		b.mu.Lock()
		b.deaf = true
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	// A rebuild later than its tick means the broker itself did not run
	// (starved of CPU, throttled, a long GC pause): heartbeats that arrived
	// meanwhile may not be read yet, so the delay beyond the tick is the
	// broker's silence, not its agents'. Only that delay is forgiven, so a
	// broker late at every rebuild still finds a dead agent; a pause of two
	// ticks or more counts as a failover for the requests that wait.
	var stalled time.Duration
	if !b.lastRebuild.IsZero() {
		stalled = now.Sub(b.lastRebuild) - rebuildEvery
		if stalled > rebuildLate-rebuildEvery {
			b.reconnected.Store(now.UnixNano())
		}
	}
	b.lastRebuild = now
	switch {
	case b.deaf:
		b.deaf = false
		b.fleet.all = true
		for _, e := range b.agents {
			if e.agent.LastSeen.Before(now) {
				e.agent.LastSeen = now
			}
		}
	case stalled > 0:
		// The shift is small at a tick only a little late; an agent it
		// makes fresh again is found by dueModels like any other change.
		for _, e := range b.agents {
			e.agent.LastSeen = minTime(e.agent.LastSeen.Add(stalled), now)
		}
	}
	due := b.dueModels(now)
	for m, t := range b.known {
		if now.Sub(t) > forgetAfter {
			delete(b.known, m)
		}
	}
	for k, t := range b.poolsHeard {
		if now.Sub(t) > forgetAfter {
			delete(b.poolsHeard, k)
		}
	}
	for id, p := range b.pending {
		if now.Sub(p.LastHeartbeat) > 3*max(p.Interval, b.cfg.HeartbeatInterval) {
			delete(b.pending, id) // missed three heartbeats: gone
		}
	}
	if len(due) == 0 {
		b.mu.Unlock()
		return // nothing any snapshot shows has changed
	}
	byModel := b.buildModels(due, now)
	b.mu.Unlock()
	f := nextFleet(b.table.Load(), due, byModel, now, b.cfg.Dispatch)
	b.table.Store(f)
	b.pruneAffinity(f)
}

// Fleet is the snapshot of the capacity table the fleet view shows; an
// alias, so the ingresses read it without importing dispatch.
type Fleet = dispatch.Fleet

// Fleet returns the current capacity snapshot.
func (b *Broker) Fleet() *dispatch.Fleet { return b.table.Load() }

// Heartbeats returns a copy of the last heartbeat of every agent in the
// table, for the fleet view.
func (b *Broker) Heartbeats() []*wire.Heartbeat {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*wire.Heartbeat, 0, len(b.agents))
	for _, e := range b.agents {
		out = append(out, e.hb)
	}
	return out
}

// InFlight is the dispatch rule's view of what a broker sent that agents
// have not reported yet (see dispatch.InFlight).
type InFlight = dispatch.InFlight

// PoolStats is one pool of a model as the fleet view shows it.
type PoolStats = dispatch.PoolStats

// InFlight returns what this broker has dispatched to model's queues and
// the agents have not yet reported, as the dispatch rule sees it.
func (b *Broker) InFlight(model string) dispatch.InFlight { return b.flight.model(model) }

// Models returns the models that have at least one live agent.
func (b *Broker) Models() []string { return b.table.Load().Models() }

func (b *Broker) knownModel(model string) bool {
	if slices.Contains(b.cfg.Models, model) {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.known[model]
	return ok
}

func (b *Broker) jobsSubject(model, pool, pair string) (string, error) {
	k := jobsKey{model, pool, pair}
	if s, ok := b.jobSubj.Load(k); ok {
		return s.(string), nil
	}
	var s string
	var err error
	if pair == "" {
		s, err = b.subj.Jobs(model, pool)
	} else {
		s, err = b.subj.PDJobs(model, pool, pair)
	}
	if err != nil {
		return "", err
	}
	b.jobSubj.Store(k, s)
	return s, nil
}

// newSecret draws an attempt's secret (wire.Job.secret): 64 bits from
// crypto/rand, never 0 (which means "no secret").
func newSecret() uint64 {
	var buf [8]byte
	_, _ = crand.Read(buf[:])
	return binary.LittleEndian.Uint64(buf[:]) | 1
}

func (b *Broker) newRequestID() string {
	// A counter keeps ids unique; the random tail makes them unguessable,
	// so an agent credential cannot aim forged chunks at a request. Made
	// in one buffer: one allocation, the string.
	var buf [64]byte
	id := append(buf[:0], b.cfg.ID...)
	id = append(id, '-')
	id = strconv.AppendUint(id, b.nextReq.Add(1), 36)
	return string(appendRandomID(id, 6))
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
