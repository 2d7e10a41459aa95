// Package pd adds the prefill/decode protocols of vLLM and SGLang to an
// engine transport (the OpenAI HTTP adapter or the in-process simulator):
// it rewrites each leg's request with the hand-off fields its engine needs.
//
// vLLM (NixlConnector and friends): the prefill leg runs with max_tokens 1,
// no streaming and kv_transfer_params.do_remote_decode=true; its answer
// carries kv_transfer_params, which the decode leg sends unchanged.
//
// SGLang: both legs carry bootstrap_host, bootstrap_port and bootstrap_room;
// the prefill agent picks the room, hands off first and runs its leg at the
// same time as the decode, whose engine pulls the KV cache from the
// prefill's bootstrap server.
package pd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Protocols.
const (
	VLLM   = "vllm"
	SGLang = "sglang"
)

var (
	_ agent.Engine    = (*Adapter)(nil)
	_ agent.Prefiller = (*Adapter)(nil)
)

// Adapter wraps a transport with one PD protocol.
type Adapter struct {
	inner    agent.Engine
	protocol string
	host     string
	port     int
	rand     func() uint64
}

// Option configures an Adapter.
type Option func(*Adapter)

// WithBootstrap sets the SGLang prefill engine's bootstrap server, which
// the decode engine connects to.
func WithBootstrap(host string, port int) Option {
	return func(a *Adapter) { a.host, a.port = host, port }
}

// WithRand replaces the source of bootstrap rooms.
func WithRand(r func() uint64) Option { return func(a *Adapter) { a.rand = r } }

// New wraps inner with protocol (VLLM or SGLang).
func New(inner agent.Engine, protocol string, opts ...Option) (*Adapter, error) {
	if protocol != VLLM && protocol != SGLang {
		return nil, fmt.Errorf("pd: protocol %q: want vllm or sglang", protocol)
	}
	a := &Adapter{inner: inner, protocol: protocol, rand: rand.Uint64}
	for _, o := range opts {
		o(a)
	}
	if protocol == SGLang && a.port < 0 {
		return nil, fmt.Errorf("pd: bootstrap port %d", a.port)
	}
	return a, nil
}

// Protocol returns the adapter's protocol.
func (a *Adapter) Protocol() string { return a.protocol }

// Health passes through to the transport when it can tell.
func (a *Adapter) Health(ctx context.Context) error {
	if h, ok := a.inner.(agent.HealthChecker); ok {
		return h.Health(ctx)
	}
	return nil
}

// Load passes through to the transport when it can tell.
func (a *Adapter) Load(ctx context.Context) (agent.Load, error) {
	if l, ok := a.inner.(agent.LoadReporter); ok {
		return l.Load(ctx)
	}
	return agent.Load{}, errors.New("pd: transport reports no load")
}

// Stream serves a regular job unchanged and a decode job with its hand-off.
func (a *Adapter) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	h := r.Job.GetPd()
	if h == nil {
		return a.inner.Stream(ctx, r, emit)
	}
	var body []byte
	var err error
	switch a.protocol {
	case VLLM:
		if len(h.GetKvTransferParamsJson()) == 0 {
			return &wire.Error{Code: wire.CodeBadRequest, Message: "decode job without kv_transfer_params from a vLLM prefill"}
		}
		body, err = oaiformat.VLLMDecodeBody(r.Body, h.GetKvTransferParamsJson())
	case SGLang:
		if h.GetBootstrapHost() == "" {
			return &wire.Error{Code: wire.CodeBadRequest, Message: "decode job without SGLang bootstrap fields"}
		}
		body, err = oaiformat.SGLangBody(r.Body, h.GetBootstrapHost(), h.GetBootstrapPort(), h.GetBootstrapRoom())
	}
	if err != nil {
		return bodyError(err)
	}
	leg := *r
	leg.Body = body
	return a.inner.Stream(ctx, &leg, emit)
}

func bodyError(err error) error {
	return &wire.Error{Code: wire.CodeBadRequest, Message: "request body: " + err.Error()}
}

// Prefill runs the prefill leg and hands off as the protocol requires.
func (a *Adapter) Prefill(ctx context.Context, r *agent.Request, handoff func(*wire.PDHandoff) error) error {
	switch a.protocol {
	case SGLang:
		return a.prefillSGLang(ctx, r, handoff)
	default:
		return a.prefillVLLM(ctx, r, handoff)
	}
}

func (a *Adapter) prefillSGLang(ctx context.Context, r *agent.Request, handoff func(*wire.PDHandoff) error) error {
	h := &wire.PDHandoff{
		Protocol:      SGLang,
		BootstrapHost: a.host,
		BootstrapPort: uint32(a.port),
		BootstrapRoom: a.rand() >> 1, // [0, 2^63-1], as SGLang's router draws it
	}
	body, err := oaiformat.SGLangBody(r.Body, h.BootstrapHost, h.BootstrapPort, h.BootstrapRoom)
	if err != nil {
		return bodyError(err)
	}
	// Hand off first: the decode engine waits on the room, so the two legs
	// overlap instead of adding up.
	if err := handoff(h); err != nil {
		return err
	}
	leg := *r
	leg.Body = body
	// The prefill engine's own output is not the client's; drain it.
	return a.inner.Stream(ctx, &leg, func([]byte, bool) error { return nil })
}

func (a *Adapter) prefillVLLM(ctx context.Context, r *agent.Request, handoff func(*wire.PDHandoff) error) error {
	// The leg as vLLM's own proxy sends it (see oaiformat.VLLMPrefillBody).
	body, err := oaiformat.VLLMPrefillBody(r.Body)
	if err != nil {
		return bodyError(err)
	}
	leg := *r
	leg.Body = body
	var params json.RawMessage
	err = a.inner.Stream(ctx, &leg, func(data []byte, _ bool) error {
		var resp struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if json.Unmarshal(data, &resp) == nil && len(resp.KV) > 0 && string(resp.KV) != "null" {
			params = append(json.RawMessage(nil), resp.KV...)
			r.PrefillUsage = append([]byte(nil), data...)
		}
		return nil
	})
	if params != nil {
		// The engine answered: it holds the KV now. Hand it off even if a
		// cancel ended the leg's stream after the answer, so a decode leg
		// reads (and frees) the KV instead of leaving it held for the
		// engine's whole lease.
		return handoff(&wire.PDHandoff{Protocol: VLLM, KvTransferParamsJson: params})
	}
	if err != nil {
		return err
	}
	if params == nil {
		return &wire.Error{Code: wire.CodeEngine, Message: "vLLM prefill answered without kv_transfer_params (is the engine started with a KV connector and kv_role kv_producer or kv_both?)"}
	}
	return handoff(&wire.PDHandoff{Protocol: VLLM, KvTransferParamsJson: params})
}
