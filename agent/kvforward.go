package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/switchyard-ai/switchyard/kvevents"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// PromptTokenizer tokenizes a request's prompt as its engine runs it, with
// the vocabulary string of each token: vLLM's /tokenize with
// return_token_strs. The KV-event translation (Config.KVEventsHash
// KVHashVLLM) consumes it.
type PromptTokenizer interface {
	TokenizePrompt(ctx context.Context, api wire.API, body []byte) (oaiformat.TokenizeResponse, error)
}

// tokenizeTimeout bounds one tokenize call: a slow one only loses
// affinity for its prompt.
const tokenizeTimeout = 10 * time.Second

// Outcomes of tokenize calls (switchyard_agent_kv_tokenize_total).
const (
	KVTokenizeOK        = "ok"
	KVTokenizeError     = "error"     // the engine did not answer, or not in vLLM's shape
	KVTokenizeSkipped   = "skipped"   // too many in flight
	KVTokenizeUnaligned = "unaligned" // no message content found in the engine's text
)

var errTokenStrs = errors.New("tokenize answer without one token string per token")

func (a *Agent) setupKVTranslation() error {
	if a.cfg.KVEvents == "" {
		return nil
	}
	subj, err := a.subj.KV(a.cfg.Model, a.cfg.Pool, a.cfg.ID)
	if err != nil {
		return err
	}
	a.kvSubj = subj
	if a.cfg.KVEventsHash != KVHashVLLM {
		return nil
	}
	if a.tokenizer == nil {
		return errors.New("agent: kv events hash vllm needs a tokenizer (an HTTP engine with vLLM's /tokenize)")
	}
	a.kvt = newKVTranslator(a.cfg.KVBlockSize, a.cfg.AffinityBlockSize, DefaultKVTranslateBlocks, DefaultKVTranslatePrefixes, func(outcome string, n int) {
		a.metrics.kvBlocks.WithLabelValues(outcome).Add(float64(n))
	})
	a.tokSem = make(chan struct{}, max(2, a.cfg.Slots))
	return nil
}

// forwardKV subscribes to the engine's KV-cache events (Config.KVEvents)
// and publishes each batch's summary on the agent's KV subject, where
// every broker applies it to its prefix tree: the precise source of
// prefix-cache affinity. The events' block hashes are either the
// broker's keys already (KVHashBroker: sim-engine) or translated to them
// (KVHashVLLM; see kvTranslator). It returns when ctx ends.
//
// Lock order: kvTranslator.mu, then the NATS connection's: a translated
// forward is published under the translator's lock, so that the brokers
// hear stored and removed keys in the order the translator decided them.
func (a *Agent) forwardKV(ctx context.Context) {
	sub := kvevents.NewSubscriber(a.cfg.KVEvents, a.cfg.KVEventsTopic, kvevents.WithLogger(a.log))
	a.log.Info("forwarding engine KV events", "endpoint", a.cfg.KVEvents, "subject", a.kvSubj, "hash", a.cfg.KVEventsHash)
	_ = sub.Run(ctx, func(u kvevents.Update) {
		if a.kvt != nil {
			a.kvt.mu.Lock()
			defer a.kvt.mu.Unlock() // published in order with learnPrompt's
			if f, ok := a.kvt.apply(u); ok {
				a.publishKV(ctx, f)
			}
			return
		}
		a.publishKV(ctx, kvevents.ForwardOf(u))
	})
}

func (a *Agent) publishKV(ctx context.Context, f kvevents.Forward) {
	data, err := f.Marshal()
	if err != nil {
		return
	}
	if err := a.nc.Publish(a.kvSubj, data); err != nil && a.log.Enabled(ctx, slog.LevelDebug) {
		a.log.Debug("kv events not forwarded", "err", err)
	}
}

// learnPrompt tokenizes job's prompt with the engine beside the engine
// call and teaches the translator which broker keys its engine blocks
// stand for. It never delays nor fails the job: with too many calls in
// flight, or a failed one, the prompt simply gets no precise affinity.
func (a *Agent) learnPrompt(job *wire.Job) {
	if a.kvt == nil {
		return
	}
	select {
	case a.tokSem <- struct{}{}:
	default:
		a.metrics.kvTokenize.WithLabelValues(KVTokenizeSkipped).Inc()
		return
	}
	a.tokWG.Add(1)
	go func() {
		defer a.tokWG.Done()
		defer func() { <-a.tokSem }()
		p, ok := oaiformat.PromptOf(job.GetApi(), job.GetBody())
		if !ok {
			return // embeddings, token-id prompts: no broker keys
		}
		ctx, cancel := context.WithTimeout(context.Background(), tokenizeTimeout)
		defer cancel()
		outcome := a.learn(ctx, job.GetApi(), job.GetBody(), p)
		a.metrics.kvTokenize.WithLabelValues(outcome).Inc()
	}()
}

func (a *Agent) learn(ctx context.Context, api wire.API, body []byte, p oaiformat.Prompt) string {
	resp, err := a.tokenizer.TokenizePrompt(ctx, api, body)
	if err == nil && len(resp.TokenStrs) != len(resp.Tokens) {
		err = errTokenStrs
	}
	if err != nil {
		if a.log.Enabled(ctx, slog.LevelDebug) {
			a.log.Debug("kv events: prompt not tokenized", "err", err)
		}
		return KVTokenizeError
	}
	pt := promptTokens{Prompt: p, IDs: resp.Tokens}
	pt.Text, pt.Ends = oaiformat.TokenText(nil, make([]int, 0, len(resp.TokenStrs)), resp.TokenStrs)
	a.kvt.mu.Lock()
	bs := a.kvt.blockSize
	a.kvt.mu.Unlock()
	plan, aligned := planPrompt(&pt, bs, a.kvt.keyBlock) // outside the lock: the costly part
	if !aligned {
		return KVTokenizeUnaligned
	}
	a.kvt.mu.Lock()
	defer a.kvt.mu.Unlock()
	if a.kvt.blockSize != bs {
		return KVTokenizeOK // the engine's block size changed meanwhile: planned for nothing
	}
	if f, ok := a.kvt.learn(plan); ok {
		a.publishKV(ctx, f)
	}
	return KVTokenizeOK
}
