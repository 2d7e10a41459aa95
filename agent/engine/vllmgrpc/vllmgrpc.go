// Package vllmgrpc is the agent's adapter for vLLM's gRPC engine service,
// vllm.grpc.engine.VllmEngine (python -m vllm.entrypoints.grpc_server, and
// the simulator's RegisterGRPC).
//
// The service takes a prompt text and sampling parameters and streams
// token ids, so the adapter does what vLLM's HTTP server does around the
// engine: it renders chat messages to text with a [ChatTemplate] (the
// service applies none), maps the OpenAI sampling parameters, detokenizes
// the ids incrementally with the engine's tokenizer (from GetTokenizer or
// a file), applies stop strings to the text, and encodes OpenAI streaming
// chunks, which the agent treats exactly as an HTTP engine's.
//
// For vLLM PD, Prefill runs the prefill leg without streaming, with
// max_tokens 1 and kv_transfer_params_json {"do_remote_decode":true}, and
// hands the returned kv_transfer_params_json to the decode leg, which
// Stream sends with the job's hand-off.
//
// Only the simulator's tokenizer format is understood (see
// [TokenizerFormat]); the Hugging Face archive a real vLLM serves needs a
// converted file given with [WithTokenizerFile] or a [WithVocabulary].
package vllmgrpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/vllmpb"
	"github.com/switchyard-ai/switchyard/wire"
)

var (
	_ agent.Engine        = (*Adapter)(nil)
	_ agent.HealthChecker = (*Adapter)(nil)
	_ agent.LoadReporter  = (*Adapter)(nil)
	_ agent.Prefiller     = (*Adapter)(nil)
)

// Adapter talks to one vLLM gRPC engine. It is safe for concurrent use.
type Adapter struct {
	conn     *grpc.ClientConn
	client   vllmpb.VllmEngineClient
	creds    credentials.TransportCredentials
	dialOpts []grpc.DialOption
	tmpl     ChatTemplate
	log      *slog.Logger
	tokFile  string

	// abortTimeout bounds the Abort call made after a cancel.
	abortTimeout time.Duration

	mu    sync.Mutex // guards vocab
	vocab Vocabulary
}

// Option configures an Adapter.
type Option func(*Adapter)

// WithTransportCredentials replaces the default insecure credentials,
// e.g. with credentials.NewTLS.
func WithTransportCredentials(c credentials.TransportCredentials) Option {
	return func(a *Adapter) { a.creds = c }
}

// WithDialOptions adds gRPC dial options.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(a *Adapter) { a.dialOpts = append(a.dialOpts, opts...) }
}

// WithTokenizerFile loads the tokenizer from path (a [TokenizerFormat] file
// or a GetTokenizer zip archive) instead of asking the engine.
func WithTokenizerFile(path string) Option { return func(a *Adapter) { a.tokFile = path } }

// WithVocabulary sets the tokenizer's vocabulary directly.
func WithVocabulary(v Vocabulary) Option { return func(a *Adapter) { a.vocab = v } }

// WithChatTemplate replaces [SimpleChatTemplate].
func WithChatTemplate(t ChatTemplate) Option { return func(a *Adapter) { a.tmpl = t } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(a *Adapter) {
		if l != nil {
			a.log = l
		}
	}
}

// New returns an adapter for the engine at target (host:port, or any
// grpc.NewClient target). The connection is made lazily.
func New(target string, opts ...Option) (*Adapter, error) {
	a := &Adapter{tmpl: SimpleChatTemplate, log: slog.New(slog.DiscardHandler), abortTimeout: 2 * time.Second}
	for _, o := range opts {
		o(a)
	}
	if a.tokFile != "" {
		data, err := os.ReadFile(a.tokFile)
		if err != nil {
			return nil, fmt.Errorf("vllm-grpc: %w", err)
		}
		v, err := ParseTokenizer(data)
		if err != nil {
			return nil, fmt.Errorf("vllm-grpc: %s: %w", a.tokFile, err)
		}
		a.vocab = v
	}
	creds := a.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, a.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("vllm-grpc: %w", err)
	}
	a.conn, a.client = conn, vllmpb.NewVllmEngineClient(conn)
	return a, nil
}

// Close closes the connection.
func (a *Adapter) Close() error { return a.conn.Close() }

// vocabulary returns the tokenizer, fetching it from the engine once.
func (a *Adapter) vocabulary(ctx context.Context) (Vocabulary, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.vocab != nil {
		return a.vocab, nil
	}
	st, err := a.client.GetTokenizer(ctx, &vllmpb.GetTokenizerRequest{})
	if err != nil {
		return nil, wireError("GetTokenizer", err)
	}
	var data []byte
	sum := ""
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, wireError("GetTokenizer", err)
		}
		data = append(data, c.GetData()...)
		if c.GetSha256() != "" {
			sum = c.GetSha256()
		}
	}
	if err := checkSHA256(data, sum); err != nil {
		return nil, &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: " + err.Error()}
	}
	v, err := ParseTokenizer(data)
	if err != nil {
		return nil, &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: engine tokenizer: " + err.Error()}
	}
	a.vocab = v
	return v, nil
}

// Health reports the engine's HealthCheck, and fails until the tokenizer
// is loaded, so that the agent stays warming until it can detokenize.
func (a *Adapter) Health(ctx context.Context) error {
	h, err := a.client.HealthCheck(ctx, &vllmpb.HealthCheckRequest{})
	if err != nil {
		return wireError("HealthCheck", err)
	}
	if !h.GetHealthy() {
		return fmt.Errorf("vllm-grpc: engine unhealthy: %s", h.GetMessage())
	}
	_, err = a.vocabulary(ctx)
	return err
}

// Load sums the engine's GetLoads over its data-parallel ranks; the KV
// usage is the highest rank's.
func (a *Adapter) Load(ctx context.Context) (agent.Load, error) {
	r, err := a.client.GetLoads(ctx, &vllmpb.GetLoadsRequest{})
	if err != nil {
		return agent.Load{}, wireError("GetLoads", err)
	}
	var l agent.Load
	for _, s := range r.GetLoads() {
		l.Running += int(s.GetNumRunningReqs())
		l.Waiting += int(s.GetNumWaitingReqs())
		l.KVCacheUsage = max(l.KVCacheUsage, s.GetTokenUsage())
	}
	return l, nil
}

// engineID is the request id the engine sees (and Abort names): the
// broker's id, with the attempt when it is a retry.
func engineID(r *agent.Request) string {
	if n := r.Job.GetAttempt(); n > 0 {
		return r.RequestID + "." + strconv.FormatUint(uint64(n), 10)
	}
	return r.RequestID
}

// Stream runs the request, or the decode leg of a vLLM PD job when the job
// carries kv_transfer_params.
func (a *Adapter) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	j, err := buildRequest(r.API, r.Body, a.tmpl)
	if err != nil {
		return err
	}
	v, err := a.vocabulary(ctx)
	if err != nil {
		return err
	}
	j.req.RequestId = engineID(r)
	if kv := r.Job.GetPd().GetKvTransferParamsJson(); len(kv) > 0 {
		s := string(kv)
		j.req.KvTransferParamsJson = &s
	}
	model := j.model
	if model == "" {
		model = r.Job.GetModel()
	}
	return a.stream(outgoing(ctx, r.Job), r.API, j, v, model, emit)
}

func (a *Adapter) stream(ctx context.Context, api wire.API, j *job, v Vocabulary, model string, emit agent.Emit) error {
	id := j.req.GetRequestId()
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := a.client.Generate(gctx, j.req)
	if err != nil {
		return a.failed(ctx, id, "Generate", err)
	}
	var (
		ch       = newChunker(api, id, model)
		detok    = NewDetokenizer(v)
		stop     = newStopFilter(j.stops)
		text     []byte
		out      []byte
		streamed int // ids received in chunks
		started  bool
	)
	send := func(b []byte) error {
		// A gRPC stream cannot tell whether the next response is here.
		if err := emit(b, false); err != nil {
			a.abort(ctx, id)
			return err
		}
		return nil
	}
	begin := func() error {
		if started {
			return nil
		}
		started = true
		if ch.chat {
			return send(ch.role())
		}
		return nil
	}
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: engine ended the stream without a complete"}
		}
		if err != nil {
			return a.failed(ctx, id, "Generate", err)
		}
		var ids []uint32
		c := resp.GetComplete()
		if c != nil {
			if streamed == 0 {
				ids = c.GetOutputIds() // a server that did not stream
			}
		} else {
			ids = resp.GetChunk().GetTokenIds()
			streamed += len(ids)
		}
		if err := begin(); err != nil {
			return err
		}
		if text, err = detok.Add(text[:0], ids); err != nil {
			a.abort(ctx, id)
			return &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: " + err.Error()}
		}
		if c != nil {
			text = detok.Flush(text)
		}
		out = stop.push(out[:0], text)
		if c != nil {
			out = stop.flush(out)
		}
		if len(out) > 0 {
			if err := send(ch.text(out)); err != nil {
				return err
			}
		}
		if c == nil {
			// After a stop string the engine stops on its own (it has the
			// same stop strings); what it still sends is discarded.
			continue
		}
		reason := c.GetFinishReason()
		switch {
		case stop.stopped:
			reason = "stop"
		case reason == "abort":
			return &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: the engine aborted the request"}
		case reason == "":
			reason = "stop"
		}
		if err := send(ch.finish(reason)); err != nil {
			return err
		}
		return send(ch.usage(c.GetPromptTokens(), c.GetCompletionTokens()))
	}
}

// outgoing adds what every engine request of job carries as gRPC
// metadata: x-request-id, one for all legs and attempts (the engine's own
// request id stays per attempt, for aborts), and the W3C trace context.
func outgoing(ctx context.Context, job *wire.Job) context.Context {
	kv := []string{"x-request-id", oaiformat.RequestID(job)}
	for _, k := range oaiformat.TraceHeaders {
		if v := job.GetTrace()[k]; v != "" {
			kv = append(kv, k, v)
		}
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// Prefill runs the prefill leg of a vLLM PD job (max_tokens 1, no stream,
// do_remote_decode) and hands the kv_transfer_params it returns to the
// decode leg.
func (a *Adapter) Prefill(ctx context.Context, r *agent.Request, handoff func(*wire.PDHandoff) error) error {
	j, err := buildRequest(r.API, r.Body, a.tmpl)
	if err != nil {
		return err
	}
	id := engineID(r)
	j.req.RequestId = id
	j.req.Stream = false
	one := uint32(1)
	j.req.SamplingParams.MaxTokens = &one
	// vLLM refuses min_tokens above max_tokens; its proxy drops them from
	// the prefill leg, and so does this one.
	j.req.SamplingParams.MinTokens = 0
	kv := string(oaiformat.VLLMPrefillParams)
	j.req.KvTransferParamsJson = &kv
	ctx = outgoing(ctx, r.Job)

	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := a.client.Generate(gctx, j.req)
	if err != nil {
		return a.failed(ctx, id, "Generate", err)
	}
	for {
		resp, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: prefill ended without a complete"}
		}
		if err != nil {
			return a.failed(ctx, id, "Generate", err)
		}
		c := resp.GetComplete()
		if c == nil {
			continue
		}
		params := bytes.TrimSpace([]byte(c.GetKvTransferParamsJson()))
		if len(params) == 0 || bytes.Equal(params, []byte("null")) {
			return &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc: the prefill returned no kv_transfer_params (is the engine a vLLM KV producer?)"}
		}
		return handoff(&wire.PDHandoff{Protocol: "vllm", KvTransferParamsJson: params})
	}
}

// failed turns a call's error into the adapter's: the context's error after
// a cancel (having aborted the engine request), else a *wire.Error.
func (a *Adapter) failed(ctx context.Context, id, call string, err error) error {
	if ctx.Err() != nil {
		a.abort(ctx, id)
		return ctx.Err()
	}
	return wireError(call, err)
}

// abort tells the engine to stop a request; cancelling the stream alone
// may leave it running until the engine notices.
func (a *Adapter) abort(ctx context.Context, id string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.abortTimeout)
	defer cancel()
	if _, err := a.client.Abort(actx, &vllmpb.AbortRequest{RequestIds: []string{id}}); err != nil {
		a.log.LogAttrs(ctx, slog.LevelWarn, "engine abort failed", slog.String("request", id), slog.String("error", err.Error()))
	}
}

// wireError maps a gRPC status to a *wire.Error.
func wireError(call string, err error) *wire.Error {
	st := status.Convert(err)
	e := &wire.Error{Code: wire.CodeEngine, Message: "vllm-grpc " + call + ": " + st.Code().String() + ": " + wire.EngineText(st.Message())}
	switch st.Code() {
	case codes.InvalidArgument:
		e.Code, e.HttpStatus = wire.CodeBadRequest, 400
	case codes.Unavailable:
		e.Code = wire.CodeEngineDown
	}
	return e
}
