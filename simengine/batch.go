package simengine

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"
)

// BatchModel is the continuous-batching timing model, [Config.Batch]; see
// the package comment, "Batch model".
type BatchModel struct {
	// Enabled replaces the constant model (TTFT, PrefillPerToken, ITL)
	// with engine steps.
	Enabled bool
	// MaxBatchedTokens bounds the prompt tokens prefilled in one step
	// (vLLM's --max-num-batched-tokens); 0 is DefaultMaxBatchedTokens.
	MaxBatchedTokens int
	// StepTime is a step's fixed cost.
	StepTime time.Duration
	// StepPerSeq is added to a step per sequence it decodes.
	StepPerSeq time.Duration
	// StepPerPrefillToken is added to a step per prompt token it prefills.
	StepPerPrefillToken time.Duration
	// KVTransferPerToken is how long a decode engine takes to receive a
	// prompt token's KV once its prefill engine has it.
	KVTransferPerToken time.Duration
}

// Defaults of the batch model; the package comment, "Batch model", names
// the profile they come from.
const (
	DefaultMaxBatchedTokens    = 8192
	DefaultStepTime            = 6400 * time.Microsecond
	DefaultStepPerSeq          = 40 * time.Microsecond
	DefaultStepPerPrefillToken = 40 * time.Microsecond
	DefaultKVTransferPerToken  = 5 * time.Microsecond
)

// DefaultBatchModel returns the batch model's defaults, not enabled.
func DefaultBatchModel() BatchModel {
	return BatchModel{
		MaxBatchedTokens:    DefaultMaxBatchedTokens,
		StepTime:            DefaultStepTime,
		StepPerSeq:          DefaultStepPerSeq,
		StepPerPrefillToken: DefaultStepPerPrefillToken,
		KVTransferPerToken:  DefaultKVTransferPerToken,
	}
}

// StepDuration is how long a step takes that decodes running sequences
// and prefills prefillTokens prompt tokens.
func (m BatchModel) StepDuration(running, prefillTokens int) time.Duration {
	return m.StepTime + time.Duration(running)*m.StepPerSeq + time.Duration(prefillTokens)*m.StepPerPrefillToken
}

// RegisterFlags defines the model's flags on fs, each name after prefix
// (cmd/sim-engine uses none, the worker agent "sim-"), with m's values as
// defaults.
func (m *BatchModel) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.BoolVar(&m.Enabled, prefix+"batch-model", m.Enabled,
		"time tokens by continuous-batching engine steps instead of the constant model: a step decodes one token of every running sequence and prefills up to --"+prefix+"max-batched-tokens prompt tokens, and takes --"+prefix+"step-time + --"+prefix+"step-per-seq x decoding sequences + --"+prefix+"step-per-prefill-token x prefilled tokens")
	fs.IntVar(&m.MaxBatchedTokens, prefix+"max-batched-tokens", m.MaxBatchedTokens, "batch model: prompt tokens prefilled per step at most (vLLM's --max-num-batched-tokens)")
	fs.DurationVar(&m.StepTime, prefix+"step-time", m.StepTime, "batch model: fixed cost of a step")
	fs.DurationVar(&m.StepPerSeq, prefix+"step-per-seq", m.StepPerSeq, "batch model: cost added to a step per sequence it decodes")
	fs.DurationVar(&m.StepPerPrefillToken, prefix+"step-per-prefill-token", m.StepPerPrefillToken, "batch model: cost added to a step per prompt token it prefills")
	fs.DurationVar(&m.KVTransferPerToken, prefix+"kv-transfer-per-token", m.KVTransferPerToken, "batch model: a decode engine receives its KV this long per prompt token after the prefill engine has it")
}

func (m BatchModel) validate() error {
	if !m.Enabled {
		return nil
	}
	if m.MaxBatchedTokens < 0 {
		return fmt.Errorf("%w: max batched tokens must not be negative, got %d", ErrInvalidConfig, m.MaxBatchedTokens)
	}
	if m.StepTime < 0 || m.StepPerSeq < 0 || m.StepPerPrefillToken < 0 || m.KVTransferPerToken < 0 {
		return fmt.Errorf("%w: batch model durations must not be negative", ErrInvalidConfig)
	}
	return nil
}

// batcher is the engine's scheduler under the batch model. Sequences join
// once they hold a slot (and, on a decode engine, their KV), in order; a
// goroutine runs steps while any sequence is in the batch and exits when
// none is, so an idle engine has none.
type batcher struct {
	m BatchModel

	// Tests set these before the first sequence joins. virtual runs steps
	// without waiting for their duration; gate, when set, is called before
	// each step is composed; record receives each step once it is done;
	// sleep waits for a KV transfer.
	virtual bool
	gate    func()
	record  func(stepRecord)
	sleep   func(ctx context.Context, d time.Duration) error

	// mu guards the batch and every batchSeq's counters.
	mu     sync.Mutex
	seqs   []*batchSeq // in the order they joined
	ids    uint64
	active bool // the step goroutine runs
	steps  int
	now    time.Duration // the steps' durations summed
}

// batchSeq is one sequence in the batch.
type batchSeq struct {
	id uint64
	// prefill is how many prompt tokens remain to prefill; want how many
	// outputs (its first token, then one per step) it takes before it
	// leaves.
	prefill, want int
	// outputs is each choice's outputs, and width how many choices still
	// generate: it counts as that many sequences in a step that decodes
	// it.
	outputs []int
	width   int
	// chunk and out are the current step's share: prompt tokens prefilled,
	// and whether it yields an output.
	chunk int
	out   bool

	produced, avail int
	in              bool          // still in the batch
	ready           chan struct{} // signalled when avail grows
}

// stepRecord describes one step, for tests.
type stepRecord struct {
	n       int           // 1 for the engine's first step
	running int           // sequences decoded
	prefill int           // prompt tokens prefilled
	dur     time.Duration // BatchModel.StepDuration(running, prefill)
	end     time.Duration // the steps' durations summed, this one's included
	outputs []uint64      // ids of the sequences given an output
}

func newBatcher(m BatchModel) *batcher {
	if m.MaxBatchedTokens == 0 {
		m.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	return &batcher{m: m, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// transfer waits for a decode's KV of promptTokens tokens to arrive.
func (b *batcher) transfer(ctx context.Context, promptTokens int) error {
	return b.sleep(ctx, time.Duration(promptTokens)*b.m.KVTransferPerToken)
}

// join adds a request that has prefill prompt tokens to prefill and whose
// choice i takes outputs[i] outputs (at least 1): its choices (n) decode
// side by side once its prompt is prefilled, as vLLM's parallel sampling
// shares the prompt's KV, and each stops counting once it has its outputs.
func (b *batcher) join(prefill int, outputs []int) *batchSeq {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ids++
	s := &batchSeq{id: b.ids, prefill: prefill, outputs: outputs, width: len(outputs), in: true, ready: make(chan struct{}, 1)}
	for _, n := range outputs {
		s.want = max(s.want, n)
	}
	s.want = max(1, s.want)
	b.seqs = append(b.seqs, s)
	if !b.active {
		b.active = true
		go b.loop()
	}
	return s
}

// leave takes s out of the batch if it is still there (an aborted
// request).
func (b *batcher) leave(s *batchSeq) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.remove(s)
}

// remove must be called with mu held.
func (b *batcher) remove(s *batchSeq) {
	if !s.in {
		return
	}
	s.in = false
	for i, q := range b.seqs {
		if q == s {
			b.seqs = append(b.seqs[:i], b.seqs[i+1:]...)
			break
		}
	}
}

// next waits for s's next output.
func (b *batcher) next(ctx context.Context, s *batchSeq) error {
	for {
		b.mu.Lock()
		if s.avail > 0 {
			s.avail--
			b.mu.Unlock()
			return nil
		}
		b.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// size returns the sequences in the batch.
func (b *batcher) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seqs)
}

// idle reports, with mu held, that the batch is empty and ends the step
// goroutine if so.
func (b *batcher) idle() bool {
	if len(b.seqs) > 0 {
		return false
	}
	b.active = false
	return true
}

// loop runs steps while the batch has sequences. Steps are paced by
// deadlines from the loop's start, so that the engine keeps its pace
// however long the delivery of outputs takes.
func (b *batcher) loop() {
	var (
		t       *time.Timer
		start   = time.Now()
		elapsed time.Duration
	)
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.idle() {
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if b.gate != nil {
			b.gate()
		}

		b.mu.Lock()
		if b.idle() {
			b.mu.Unlock()
			return
		}
		running, prefill := b.compose()
		dur := b.m.StepDuration(running, prefill)
		b.mu.Unlock()

		elapsed += dur
		if d := time.Until(start.Add(elapsed)); !b.virtual && d > 0 {
			if t == nil {
				t = time.NewTimer(d)
			} else {
				t.Reset(d)
			}
			<-t.C
		}

		b.mu.Lock()
		b.steps++
		b.now += dur
		rec := stepRecord{n: b.steps, running: running, prefill: prefill, dur: dur, end: b.now}
		b.deliver(&rec)
		b.mu.Unlock()
		if b.record != nil {
			b.record(rec)
		}
	}
}

// compose decides the step with mu held: every sequence done prefilling
// decodes one token (of each of its choices), and the others, in the order they joined, prefill
// up to MaxBatchedTokens prompt tokens between them. A sequence whose
// prefill ends in the step gets its first token at the step's end.
func (b *batcher) compose() (running, prefill int) {
	budget := b.m.MaxBatchedTokens
	for _, s := range b.seqs {
		s.chunk, s.out = 0, false
		switch {
		case s.prefill == 0:
			running += s.width
			s.out = true
		case budget > 0:
			s.chunk = min(budget, s.prefill)
			budget -= s.chunk
			prefill += s.chunk
			s.out = s.chunk == s.prefill
		}
	}
	return running, prefill
}

// deliver applies the step composed to the sequences still in the batch,
// with mu held. A sequence that left during the step is not there.
func (b *batcher) deliver(rec *stepRecord) {
	done := 0
	for _, s := range b.seqs {
		s.prefill -= s.chunk
		if !s.out {
			continue
		}
		s.produced++
		s.avail++
		s.width = 0
		for _, n := range s.outputs {
			if n > s.produced {
				s.width++
			}
		}
		select {
		case s.ready <- struct{}{}:
		default:
		}
		if b.record != nil {
			rec.outputs = append(rec.outputs, s.id)
		}
		if s.produced >= s.want {
			s.in = false
			done++
		}
	}
	if done > 0 {
		kept := b.seqs[:0]
		for _, s := range b.seqs {
			if s.in {
				kept = append(kept, s)
			}
		}
		clear(b.seqs[len(kept):])
		b.seqs = kept
	}
}
