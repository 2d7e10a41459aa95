// Package openai is the agent's adapter for any OpenAI-compatible engine
// (vLLM, SGLang, TGI, llama.cpp server...): it posts the job's request to
// /v1/chat/completions or /v1/completions and reads the SSE stream.
package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

var (
	_ agent.Engine        = (*Adapter)(nil)
	_ agent.HealthChecker = (*Adapter)(nil)
	_ agent.LoadReporter  = (*Adapter)(nil)
	_ agent.Embedder      = (*Adapter)(nil)
)

// Adapter talks to one engine over HTTP, through a net/http client of its
// own.
type Adapter struct {
	base          string
	client        *http.Client
	apiKey        string
	model         string        // see WithModel
	maxEvent      int           // see WithMaxEvent
	headerTimeout time.Duration // see WithHeaderTimeout
}

// Option configures an Adapter.
type Option func(*Adapter)

// WithAPIKey sends "Authorization: Bearer key" to the engine.
func WithAPIKey(key string) Option { return func(a *Adapter) { a.apiKey = key } }

// WithHTTPClient replaces the HTTP client, for every request.
func WithHTTPClient(c *http.Client) Option { return func(a *Adapter) { a.client = c } }

// DefaultMaxEvent bounds an SSE line and an SSE event's data from the
// engine (and an answer that is one JSON object): well under the NATS
// maximum payload (1 MiB by default) a token message must fit in.
const DefaultMaxEvent = 256 << 10

// WithMaxEvent sets the bound on an SSE line and event (DefaultMaxEvent
// when n <= 0). An engine that sends a longer one fails the request, once:
// another engine would answer the same request the same way.
func WithMaxEvent(n int) Option {
	return func(a *Adapter) {
		if n > 0 {
			a.maxEvent = n
		}
	}
}

// DefaultHeaderTimeout is how long a streaming request waits for the
// engine's response headers.
const DefaultHeaderTimeout = 30 * time.Second

// WithHeaderTimeout bounds the wait for the response headers of a
// streaming request (0: no bound). vLLM and SGLang answer a streaming
// request's headers as soon as they accept it, before its prefill: an
// engine that sends none by then is hung, and the request fails with an
// engine_unavailable error that the broker retries on another agent.
func WithHeaderTimeout(d time.Duration) Option { return func(a *Adapter) { a.headerTimeout = d } }

// idleConnTimeout is how long an idle connection to the engine is kept.
// Engines close idle connections themselves (uvicorn, under vLLM and
// SGLang, after 5s): one kept beyond that would fail its next request.
const idleConnTimeout = 3 * time.Second

// New returns an adapter for the engine at baseURL (e.g.
// http://127.0.0.1:8000), keeping up to conns idle connections to it.
func New(baseURL string, conns int, opts ...Option) (*Adapter, error) {
	if !strings.HasPrefix(baseURL, "http://") && !strings.HasPrefix(baseURL, "https://") {
		return nil, fmt.Errorf("openai engine: url %q: want http:// or https://", baseURL)
	}
	tr := &http.Transport{
		Proxy:               nil, // the engine is beside the agent; never via a proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns + 4,
		MaxIdleConnsPerHost: conns + 4,
		IdleConnTimeout:     idleConnTimeout,
		DisableCompression:  true, // SSE must not sit in a gzip buffer
		ForceAttemptHTTP2:   false,
		ReadBufferSize:      sseBufferSize,
	}
	a := &Adapter{
		base:          strings.TrimRight(baseURL, "/"),
		client:        &http.Client{Transport: tr},
		maxEvent:      DefaultMaxEvent,
		headerTimeout: DefaultHeaderTimeout,
	}
	for _, o := range opts {
		o(a)
	}
	if !validHeaderValue(a.apiKey) {
		return nil, errors.New("openai engine: the API key holds a control character, which no HTTP header can carry")
	}
	return a, nil
}

func (a *Adapter) newRequest(ctx context.Context, method, path string, body []byte) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+a.apiKey)
	}
	return req, nil
}

// Path returns the endpoint path of an API kind.
func Path(api wire.API) (string, error) {
	switch api {
	case wire.API_API_CHAT:
		return "/v1/chat/completions", nil
	case wire.API_API_COMPLETION:
		return "/v1/completions", nil
	}
	return "", &wire.Error{Code: wire.CodeBadRequest, Message: fmt.Sprintf("unsupported api %v", api)}
}

// Stream posts the request and relays each SSE data event.
func (a *Adapter) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	path, err := Path(r.API)
	if err != nil {
		return err
	}
	return a.post(ctx, path, r.Body, r.Job, emit)
}

// Post sends body to path and relays the SSE data events of the answer; it
// is exported for the PD adapters, which post variants of the request.
func (a *Adapter) Post(ctx context.Context, path string, body []byte, emit agent.Emit) error {
	return a.post(ctx, path, body, nil, emit)
}

// errHeaderTimeout ends a streaming request whose engine sent no response
// headers within the adapter's header timeout.
var errHeaderTimeout = errors.New("no response headers in time")

// post is Post with the headers job gives every engine request: one
// X-Request-Id for all its legs and attempts, and the client's W3C trace
// context, so the engine's logs and traces join the client's. The request
// ends with ctx: its connection is closed, which tells the engine.
func (a *Adapter) post(ctx context.Context, path string, body []byte, job *wire.Job, emit agent.Emit) error {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := a.newRequest(rctx, http.MethodPost, path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	// The request may be sent again on a new connection when a kept-alive
	// one turns out closed before any answer came (an engine that closed
	// it while idle): net/http retries only requests it may replay, and
	// this entry, never sent, says so.
	req.Header["Idempotency-Key"] = nil
	if job != nil {
		// A value no header can carry (a control character) is left out
		// rather than failing the job.
		if id := oaiformat.RequestID(job); id != "" && validHeaderValue(id) {
			req.Header.Set("X-Request-Id", id)
		}
		for _, k := range oaiformat.TraceHeaders {
			if v := job.GetTrace()[k]; v != "" && validHeaderValue(v) {
				req.Header.Set(k, v)
			}
		}
	}
	var timer *time.Timer
	if a.headerTimeout > 0 {
		timer = time.AfterFunc(a.headerTimeout, func() { cancel(errHeaderTimeout) })
	}
	resp, err := a.client.Do(req)
	if timer != nil && !timer.Stop() && ctx.Err() == nil {
		if err == nil {
			resp.Body.Close()
		}
		return &wire.Error{Code: wire.CodeEngineDown, Message: fmt.Sprintf("engine %s: no response headers within %s (--engine-header-timeout)", a.base, a.headerTimeout)}
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &wire.Error{Code: wire.CodeEngineDown, Message: err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := statusError(resp)
		if we := a.refusal(resp.StatusCode, path, err.GetMessage()); we != nil {
			return we
		}
		return err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		// A server that ignored stream=true: relay its one JSON object.
		data, err := io.ReadAll(io.LimitReader(resp.Body, int64(a.maxEvent)+1))
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return &wire.Error{Code: wire.CodeEngine, Message: err.Error()}
		case len(data) > a.maxEvent:
			return tooLarge(a.base, "answer", a.maxEvent)
		}
		return emit(data, false)
	}
	err = readSSE(resp.Body, a.maxEvent, a.base, emit)
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func eventError(data []byte) *wire.Error {
	if !bytes.Contains(data, []byte(`"error"`)) {
		return nil
	}
	var e struct {
		Error *struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error == nil {
		return nil
	}
	return &wire.Error{Code: wire.CodeEngine, Message: wire.EngineText(e.Error.Message)}
}

// errorBodyLimit bounds what is read of an engine's error body: its
// message, clipped to wire.MaxEngineText, is all that goes on.
const errorBodyLimit = 64 << 10

func statusError(resp *http.Response) *wire.Error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
	msg := strings.TrimSpace(string(data))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
		Message string `json:"message"`
	}
	if json.Unmarshal(data, &e) == nil {
		if e.Error.Message != "" {
			msg = e.Error.Message
		} else if e.Message != "" {
			msg = e.Message
		}
	}
	code := wire.CodeEngine
	if resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests {
		code = wire.CodeBadRequest
	}
	return &wire.Error{Code: code, Message: fmt.Sprintf("engine answered %d: %s", resp.StatusCode, wire.EngineText(msg)), HttpStatus: uint32(resp.StatusCode)}
}

// Health asks the engine's /health (vLLM and SGLang both serve it), then,
// with the agent's key, /v1/models (see checkModels): a wrong key or model
// never makes the agent ready.
func (a *Adapter) Health(ctx context.Context) error {
	req, err := a.newRequest(ctx, http.MethodGet, "/health", nil)
	if err != nil {
		return err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return a.refusal(resp.StatusCode, "GET /health", resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("engine health: %s", resp.Status)
	}
	return a.checkModels(ctx)
}

// Models lists the engine's served models (/v1/models).
func (a *Adapter) Models(ctx context.Context) ([]string, error) {
	req, err := a.newRequest(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return nil, fmt.Errorf("engine models: %w", err)
	}
	out := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		out = append(out, m.ID)
	}
	return out, nil
}

// Load scrapes the engine's Prometheus /metrics for vLLM's gauges
// (vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc) and SGLang's (sglang:num_running_reqs,
// sglang:num_queue_reqs, sglang:token_usage).
func (a *Adapter) Load(ctx context.Context) (agent.Load, error) {
	req, err := a.newRequest(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return agent.Load{}, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return agent.Load{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return agent.Load{}, fmt.Errorf("engine metrics: %s", resp.Status)
	}
	return ParseLoad(io.LimitReader(resp.Body, 8<<20))
}

// ParseLoad reads the load gauges from a Prometheus text exposition, summing
// series of the same gauge (one per model or engine rank).
func ParseLoad(r io.Reader) (agent.Load, error) {
	var l agent.Load
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return l, fmt.Errorf("engine metrics: %w", err)
	}
	found := false
	for name, mf := range families {
		var v float64 // the sum of its series
		for _, m := range mf.GetMetric() {
			switch {
			case m.Gauge != nil:
				v += m.GetGauge().GetValue()
			case m.Counter != nil:
				v += m.GetCounter().GetValue()
			case m.Untyped != nil:
				v += m.GetUntyped().GetValue()
			}
		}
		switch name {
		case "vllm:num_requests_running", "sglang:num_running_reqs":
			l.Running += int(v)
			found = true
		case "vllm:num_requests_waiting", "sglang:num_queue_reqs":
			l.Waiting += int(v)
			found = true
		case "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage":
			for _, m := range mf.GetMetric() {
				l.KVCacheUsage = max(l.KVCacheUsage, m.GetGauge().GetValue(), m.GetUntyped().GetValue())
			}
			found = true
		case "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries":
			l.PrefixQueries += v
			l.HasPrefix = true
		case "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits":
			l.PrefixHits += v
			l.HasPrefix = true
		}
	}
	if !found {
		return l, errors.New("engine metrics: no load gauges")
	}
	return l, nil
}

// validHeaderValue reports whether v can be a header field's value: no
// control character but the tab (what net/http accepts).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
