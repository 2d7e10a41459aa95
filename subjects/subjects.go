package subjects

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// DefaultPrefix is the first token of every Switchyard subject.
const DefaultPrefix = "sy"

// MaxTokenLen bounds an escaped token. A model id that escapes to more than
// this is refused rather than producing subjects that waste every message's
// header; 1 KiB of escaped text is far beyond any real model id.
const MaxTokenLen = 1024

// Pools as they appear in subjects.
const (
	PoolRegular = "regular"
	PoolPrefill = "prefill"
	PoolDecode  = "decode"
)

// Kinds of subject, the second token after the prefix.
const (
	kindJobs   = "jobs"
	kindHB     = "hb"
	kindReply  = "reply"
	kindCancel = "cancel"
	kindKV     = "kv"
	kindLearn  = "learn"
	// kindTo is the directed queues' kind: outside <prefix>.jobs.>, so
	// they live in a stream of their own (JetStream forbids two streams
	// whose subjects overlap).
	kindTo = "to"
)

// batchTok marks a batch-class queue: <prefix>.jobs.<model>.batch.<pool>[.<pair>].
// It takes the place of the pool token, which is one of the pool literals
// everywhere else, so a batch queue never matches a shared or directed
// queue's filter and parses unambiguously.
const batchTok = "batch"

// Builder builds and parses subjects under one prefix. The zero value is not
// usable; call New.
type Builder struct {
	prefix string
	dot    string // prefix + "."
}

// New returns a Builder for prefix, which may hold several tokens ("sy" or
// "prod.sy") but no wildcards, whitespace or empty tokens.
func New(prefix string) (Builder, error) {
	if prefix == "" {
		return Builder{}, fmt.Errorf("%w: empty", ErrBadPrefix)
	}
	for _, tok := range strings.Split(prefix, ".") {
		if !validLiteralToken(tok) {
			return Builder{}, fmt.Errorf("%w: %q", ErrBadPrefix, prefix)
		}
	}
	return Builder{prefix: prefix, dot: prefix + "."}, nil
}

// Must is New for prefixes known at compile time.
func Must(prefix string) Builder {
	b, err := New(prefix)
	if err != nil {
		panic(err)
	}
	return b
}

// Prefix returns the builder's prefix.
func (b Builder) Prefix() string { return b.prefix }

func validLiteralToken(tok string) bool {
	if tok == "" {
		return false
	}
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c <= ' ' || c == '*' || c == '>' || c == '.' || c >= 0x7f {
			return false
		}
	}
	return true
}

func validPool(pool string) bool {
	return pool == PoolRegular || pool == PoolPrefill || pool == PoolDecode
}

// Jobs returns the subject of model's job queue for pool.
func (b Builder) Jobs(model, pool string) (string, error) {
	if !validPool(pool) {
		return "", fmt.Errorf("%w: pool %q", ErrNotMatch, pool)
	}
	m, err := Escape(model)
	if err != nil {
		return "", fmt.Errorf("model %q: %w", model, err)
	}
	return b.dot + kindJobs + "." + m + "." + pool, nil
}

// PDJobs returns the subject of model's job queue for a PD pool (prefill or
// decode) of one pairing: sy.jobs.<model>.<pool>.<pair>, pair escaped. Agents
// pull only from the queue of their own pairing, so a prefill agent hands
// off only to decode agents that can take its hand-off (see PairKey).
func (b Builder) PDJobs(model, pool, pair string) (string, error) {
	if pool != PoolPrefill && pool != PoolDecode {
		return "", fmt.Errorf("%w: PD pool %q", ErrNotMatch, pool)
	}
	base, err := b.Jobs(model, pool)
	if err != nil {
		return "", err
	}
	p, err := Escape(pair)
	if err != nil {
		return "", fmt.Errorf("pairing %q: %w", pair, err)
	}
	return base + "." + p, nil
}

// Directed returns the subject of the directed queue of one agent beside a
// pool's shared queue: <prefix>.to.<model>.<pool>.<agent>, or
// <prefix>.to.<model>.<pool>.<pair>.<agent> for a PD pairing, model, pair
// and agent escaped. Only that agent pulls it (see DirectedConsumerName).
// Directed queues are not under <prefix>.jobs.>: they are kept in a
// stream of their own (DirectedStream), with one replica, so that the
// consumer every agent has on its queue costs the servers no raft group.
func (b Builder) Directed(model, pool, pair, agent string) (string, error) {
	if !validPool(pool) || (pool == PoolRegular && pair != "") {
		return "", fmt.Errorf("%w: pool %q with pairing %q", ErrNotMatch, pool, pair)
	}
	m, err := Escape(model)
	if err != nil {
		return "", fmt.Errorf("model %q: %w", model, err)
	}
	base := b.dot + kindTo + "." + m + "." + pool
	if pair != "" {
		p, err := Escape(pair)
		if err != nil {
			return "", fmt.Errorf("pairing %q: %w", pair, err)
		}
		base += "." + p
	}
	a, err := Escape(agent)
	if err != nil {
		return "", fmt.Errorf("agent %q: %w", agent, err)
	}
	return base + "." + a, nil
}

// DirectedAll is the filter of the directed stream: every agent's queue.
func (b Builder) DirectedAll() string { return b.dot + kindTo + ".>" }

// DirectedStream returns the name of the stream of the directed queues
// beside the jobs stream named jobs.
func DirectedStream(jobs string) string { return jobs + "_DIRECTED" }

// ParseDirected parses a subject built by Directed.
func (b Builder) ParseDirected(subject string) (Jobs, error) {
	toks, err := b.splitRange(subject, kindTo, 3, 4)
	if err != nil {
		return Jobs{}, err
	}
	j, err := parseQueue(subject, toks[:len(toks)-1])
	if err != nil {
		return Jobs{}, err
	}
	if j.To, err = Unescape(toks[len(toks)-1]); err != nil {
		return Jobs{}, err
	}
	if j.To == "" {
		return Jobs{}, fmt.Errorf("%w: empty agent in %q", ErrNotMatch, subject)
	}
	return j, nil
}

// BatchJobs returns the subject of model's batch-class queue for pool
// (pair "" for the regular pool, a PD pairing otherwise):
// <prefix>.jobs.<model>.batch.<pool>[.<pair>]. Agents pull it beside their
// interactive queue, only with room interactive work leaves; a prefill
// agent hands a batch job off to the decode pool's batch queue.
func (b Builder) BatchJobs(model, pool, pair string) (string, error) {
	if !validPool(pool) {
		return "", fmt.Errorf("%w: pool %q", ErrNotMatch, pool)
	}
	if pool == PoolRegular && pair != "" {
		return "", fmt.Errorf("%w: regular queue with a pairing %q", ErrNotMatch, pair)
	}
	m, err := Escape(model)
	if err != nil {
		return "", fmt.Errorf("model %q: %w", model, err)
	}
	s := b.dot + kindJobs + "." + m + "." + batchTok + "." + pool
	if pair != "" {
		p, err := Escape(pair)
		if err != nil {
			return "", fmt.Errorf("pairing %q: %w", pair, err)
		}
		s += "." + p
	}
	return s, nil
}

// BatchConsumerName returns the durable consumer shared by the agents of
// one pool (and pairing, "" for none) for its batch queue (see BatchJobs).
func BatchConsumerName(model, pool, pair string) (string, error) {
	var name string
	var err error
	if pair == "" {
		name, err = ConsumerName(model, pool)
	} else {
		name, err = PDConsumerName(model, pool, pair)
	}
	if err != nil {
		return "", err
	}
	return name + "-batch", nil
}

// DirectedConsumerName returns the durable consumer of one agent's
// directed queue (see Directed): the pool's consumer name and a short hash
// of the agent id (and pairing), so any id gives a valid name.
func DirectedConsumerName(model, pool, pair, agent string) (string, error) {
	var name string
	var err error
	if pair == "" {
		name, err = ConsumerName(model, pool)
	} else {
		name, err = PDConsumerName(model, pool, pair)
	}
	if err != nil {
		return "", err
	}
	if agent == "" {
		return "", ErrEmpty
	}
	sum := sha256.Sum256([]byte(agent))
	return name + "-to-" + hex.EncodeToString(sum[:8]), nil
}

// KV returns the subject an agent forwards its engine's KV-cache events
// on, summarised: <prefix>.kv.<model>.<pool>.<agent>.
func (b Builder) KV(model, pool, agent string) (string, error) {
	return b.modelPoolAgent(kindKV, model, pool, agent)
}

// KVAll matches every agent's KV-cache events.
func (b Builder) KVAll() string { return b.dot + kindKV + ".>" }

// Learn returns the subject a broker shares what it offered on:
// <prefix>.learn.<model>.<pool>.<broker> carries (agent, block keys) of
// the requests it sent, so its peers' prefix trees see them too. broker is
// the broker's own subject-safe id.
func (b Builder) Learn(model, pool, broker string) (string, error) {
	if !validID(broker) {
		return "", fmt.Errorf("%w: broker id %q", ErrBadToken, broker)
	}
	return b.modelPoolAgent(kindLearn, model, pool, broker)
}

// LearnAll matches every broker's shared offers.
func (b Builder) LearnAll() string { return b.dot + kindLearn + ".>" }

func (b Builder) modelPoolAgent(kind, model, pool, agent string) (string, error) {
	if !validPool(pool) {
		return "", fmt.Errorf("%w: pool %q", ErrNotMatch, pool)
	}
	m, err := Escape(model)
	if err != nil {
		return "", fmt.Errorf("model %q: %w", model, err)
	}
	a, err := Escape(agent)
	if err != nil {
		return "", fmt.Errorf("agent %q: %w", agent, err)
	}
	return b.dot + kind + "." + m + "." + pool + "." + a, nil
}

// ParseKV parses a subject built by KV; Heartbeat's fields name its
// tokens.
func (b Builder) ParseKV(subject string) (Heartbeat, error) {
	return b.parseModelPoolAgent(subject, kindKV)
}

// ParseLearn parses a subject built by Learn; Agent is the broker's id.
func (b Builder) ParseLearn(subject string) (Heartbeat, error) {
	return b.parseModelPoolAgent(subject, kindLearn)
}

// JobsProbe returns the subject a broker writes to, and deletes from at
// once, to learn whether the jobs stream stores what it writes:
// <prefix>.jobs.<broker>, one token after "jobs" where every queue has at
// least two, so no agent's consumer takes it and ParseJobs refuses it.
func (b Builder) JobsProbe(broker string) (string, error) {
	if !validID(broker) {
		return "", fmt.Errorf("%w: broker id %q", ErrBadToken, broker)
	}
	return b.dot + kindJobs + "." + broker, nil
}

// JobsAll is the filter of the jobs stream: every model and pool.
func (b Builder) JobsAll() string { return b.dot + kindJobs + ".>" }

// Heartbeat returns the subject an agent heartbeats on.
func (b Builder) Heartbeat(model, pool, agent string) (string, error) {
	return b.modelPoolAgent(kindHB, model, pool, agent)
}

// HeartbeatsAll matches every heartbeat.
func (b Builder) HeartbeatsAll() string { return b.dot + kindHB + ".>" }

// Reply returns the reply subject of one request of one broker. Both ids are
// the broker's own and must already be subject-safe tokens.
func (b Builder) Reply(broker, request string) (string, error) {
	if !validID(broker) || !validID(request) {
		return "", fmt.Errorf("%w: reply ids %q %q", ErrBadToken, broker, request)
	}
	return b.dot + kindReply + "." + broker + "." + request, nil
}

// ReplyChunksToken is the last token of a broker's shared reply subject.
// It has no '-', so it is never a request id of the broker's (its id, a
// dash and a counter).
const ReplyChunksToken = "chunks"

// ReplyChunks returns the one reply subject of a broker that every agent
// sends its chunks to, framed (see wire.Frames) and with the attempt's
// secret: one subject for all requests lets an agent put the chunks of
// several requests into one message. ReplyAll matches it too.
func (b Builder) ReplyChunks(broker string) (string, error) {
	return b.Reply(broker, ReplyChunksToken)
}

// ReplyAll matches every reply subject of one broker; the broker subscribes
// to it once and demultiplexes by request id.
func (b Builder) ReplyAll(broker string) (string, error) {
	if !validID(broker) {
		return "", fmt.Errorf("%w: broker id %q", ErrBadToken, broker)
	}
	return b.dot + kindReply + "." + broker + ".*", nil
}

// Cancel returns the cancel subject of one request.
func (b Builder) Cancel(request string) (string, error) {
	if !validID(request) {
		return "", fmt.Errorf("%w: request id %q", ErrBadToken, request)
	}
	return b.dot + kindCancel + "." + request, nil
}

// CancelAll matches every cancel; agents subscribe to it and look up the
// request id among the jobs they hold.
func (b Builder) CancelAll() string { return b.dot + kindCancel + ".*" }

// validID reports whether id is a token made only of the escape alphabet,
// which is what the broker's generated ids are.
func validID(id string) bool {
	if id == "" || len(id) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !plain(id[i]) && id[i] != '_' {
			return false
		}
	}
	return true
}

// Jobs is a parsed jobs subject. Pair is set for PD queues (PDJobs), To
// for directed queues (Directed), Batch for batch-class queues
// (BatchJobs).
type Jobs struct {
	Model, Pool, Pair, To string
	Batch                 bool
}

// ParseJobs parses a subject built by Jobs, PDJobs, Directed or
// BatchJobs.
func (b Builder) ParseJobs(subject string) (Jobs, error) {
	if strings.HasPrefix(subject, b.dot+kindTo+".") {
		return b.ParseDirected(subject)
	}
	toks, err := b.splitRange(subject, kindJobs, 2, 4)
	if err != nil {
		return Jobs{}, err
	}
	if len(toks) >= 3 && toks[1] == batchTok {
		return b.parseBatch(subject, toks)
	}
	if len(toks) > 3 {
		return Jobs{}, fmt.Errorf("%w: %q has too many tokens for a jobs queue", ErrNotMatch, subject)
	}
	return parseQueue(subject, toks)
}

// parseQueue parses a queue's tokens: model, pool and, for a PD pool, the
// pairing.
func parseQueue(subject string, toks []string) (Jobs, error) {
	m, err := Unescape(toks[0])
	if err != nil {
		return Jobs{}, err
	}
	if !validPool(toks[1]) {
		return Jobs{}, fmt.Errorf("%w: pool %q", ErrNotMatch, toks[1])
	}
	j := Jobs{Model: m, Pool: toks[1]}
	if len(toks) == 3 {
		if j.Pool == PoolRegular {
			return Jobs{}, fmt.Errorf("%w: regular queue with a pairing %q", ErrNotMatch, subject)
		}
		if j.Pair, err = Unescape(toks[2]); err != nil {
			return Jobs{}, err
		}
	}
	return j, nil
}

// parseBatch parses the tokens of a BatchJobs subject: model, "batch",
// pool and, for a PD pool, the pairing.
func (b Builder) parseBatch(subject string, toks []string) (Jobs, error) {
	if len(toks) > 4 {
		return Jobs{}, fmt.Errorf("%w: %q has too many tokens for a batch queue", ErrNotMatch, subject)
	}
	j, err := parseQueue(subject, append([]string{toks[0]}, toks[2:]...))
	j.Batch = err == nil
	return j, err
}

// Heartbeat is a parsed heartbeat subject.
type Heartbeat struct{ Model, Pool, Agent string }

// ParseHeartbeat parses a subject built by Heartbeat.
func (b Builder) ParseHeartbeat(subject string) (Heartbeat, error) {
	return b.parseModelPoolAgent(subject, kindHB)
}

func (b Builder) parseModelPoolAgent(subject, kind string) (Heartbeat, error) {
	toks, err := b.split(subject, kind, 3)
	if err != nil {
		return Heartbeat{}, err
	}
	m, err := Unescape(toks[0])
	if err != nil {
		return Heartbeat{}, err
	}
	if !validPool(toks[1]) {
		return Heartbeat{}, fmt.Errorf("%w: pool %q", ErrNotMatch, toks[1])
	}
	a, err := Unescape(toks[2])
	if err != nil {
		return Heartbeat{}, err
	}
	return Heartbeat{Model: m, Pool: toks[1], Agent: a}, nil
}

// Reply is a parsed reply subject.
type Reply struct{ Broker, Request string }

// ParseReply parses a subject built by Reply.
func (b Builder) ParseReply(subject string) (Reply, error) {
	toks, err := b.split(subject, kindReply, 2)
	if err != nil {
		return Reply{}, err
	}
	if !validID(toks[0]) || !validID(toks[1]) {
		return Reply{}, fmt.Errorf("%w: %q", ErrBadToken, subject)
	}
	return Reply{Broker: toks[0], Request: toks[1]}, nil
}

// ParseCancel returns the request id of a subject built by Cancel.
func (b Builder) ParseCancel(subject string) (string, error) {
	toks, err := b.split(subject, kindCancel, 1)
	if err != nil {
		return "", err
	}
	if !validID(toks[0]) {
		return "", fmt.Errorf("%w: %q", ErrBadToken, subject)
	}
	return toks[0], nil
}

// split checks prefix and kind and returns exactly n remaining tokens.
func (b Builder) split(subject, kind string, n int) ([]string, error) {
	return b.splitRange(subject, kind, n, n)
}

// splitRange checks prefix and kind and returns the lo to hi remaining
// tokens.
func (b Builder) splitRange(subject, kind string, lo, hi int) ([]string, error) {
	rest, ok := strings.CutPrefix(subject, b.dot)
	if !ok {
		return nil, fmt.Errorf("%w: %q lacks prefix %q", ErrNotMatch, subject, b.prefix)
	}
	rest, ok = strings.CutPrefix(rest, kind+".")
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a %s subject", ErrNotMatch, subject, kind)
	}
	toks := strings.Split(rest, ".")
	if len(toks) < lo || len(toks) > hi {
		return nil, fmt.Errorf("%w: %q has %d tokens after %s, want %d to %d", ErrNotMatch, subject, len(toks), kind, lo, hi)
	}
	return toks, nil
}

// ConsumerName returns the durable JetStream consumer name shared by every
// agent of (model, pool). Names hold only [A-Za-z0-9_-]; a long escaped model
// id is shortened with a hash so the name stays within JetStream's limits.
func ConsumerName(model, pool string) (string, error) {
	if !validPool(pool) {
		return "", fmt.Errorf("%w: pool %q", ErrNotMatch, pool)
	}
	m, err := Escape(model)
	if err != nil {
		return "", fmt.Errorf("model %q: %w", model, err)
	}
	if len(m) > maxConsumerModel {
		sum := sha256.Sum256([]byte(model))
		m = m[:maxConsumerModel-17] + "_" + hex.EncodeToString(sum[:8])
	}
	return "jobs-" + m + "-" + pool, nil
}

// PDConsumerName returns the durable consumer shared by the agents of one
// PD pool of one pairing (see PDJobs). The pairing enters the name as a
// short hash, so any pairing key gives a valid name.
func PDConsumerName(model, pool, pair string) (string, error) {
	if pool != PoolPrefill && pool != PoolDecode {
		return "", fmt.Errorf("%w: PD pool %q", ErrNotMatch, pool)
	}
	name, err := ConsumerName(model, pool)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(pair))
	return name + "-" + hex.EncodeToString(sum[:6]), nil
}

// PairKey is the pairing key of a PD agent: its PD protocol and the labels
// its operator declared must match (KV connector, engine version, ...), so
// the key is the protocol, then the canonical labels after a "+". labels
// must be canonical (see CanonicalLabels).
func PairKey(protocol, labels string) string {
	if labels == "" {
		return protocol
	}
	return protocol + "+" + labels
}

// CanonicalLabels parses "k=v,k=v" (spaces around items allowed) into the
// canonical form: sorted by key, no duplicates, keys and values non-empty
// and free of ',', '=' and whitespace.
func CanonicalLabels(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", nil
	}
	items := strings.Split(s, ",")
	seen := make(map[string]bool, len(items))
	out := make([]string, 0, len(items))
	for _, it := range items {
		k, v, ok := strings.Cut(strings.TrimSpace(it), "=")
		if !ok || k == "" || v == "" || strings.ContainsAny(k, "=, \t\n") || strings.ContainsAny(v, "=, \t\n") {
			return "", fmt.Errorf("%w: label %q (want key=value)", ErrBadToken, it)
		}
		if seen[k] {
			return "", fmt.Errorf("%w: label %q declared twice", ErrBadToken, k)
		}
		seen[k] = true
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return strings.Join(out, ","), nil
}

// maxConsumerModel keeps consumer names well under the 255 bytes that file
// stores accept as a directory name.
const maxConsumerModel = 160
