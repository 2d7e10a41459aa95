// Package sim is the agent's in-process engine: the simulator of package
// simengine called directly, without HTTP, for demos and tests.
package sim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/simengine"
	"github.com/switchyard-ai/switchyard/wire"
)

var (
	_ agent.Engine        = (*Adapter)(nil)
	_ agent.LoadReporter  = (*Adapter)(nil)
	_ agent.HealthChecker = (*Adapter)(nil)
	_ agent.Embedder      = (*Adapter)(nil)
)

// Adapter runs jobs on an in-process simulated engine.
type Adapter struct{ e *simengine.Engine }

// New wraps e.
func New(e *simengine.Engine) *Adapter { return &Adapter{e: e} }

// Engine returns the simulator, for tests that inspect it.
func (a *Adapter) Engine() *simengine.Engine { return a.e }

// Stream runs the request on the simulator.
func (a *Adapter) Stream(ctx context.Context, r *agent.Request, emit agent.Emit) error {
	api := simengine.APIChat
	if r.API == wire.API_API_COMPLETION {
		api = simengine.APICompletion
	}
	// The simulator makes each chunk when it is due: none is ever at hand early.
	err := a.e.Stream(ctx, api, r.Body, func(b []byte) error { return emit(b, false) })
	var se *simengine.Error
	if errors.As(err, &se) {
		code := wire.CodeEngine
		if se.Status >= 400 && se.Status < 500 && se.Status != http.StatusTooManyRequests {
			code = wire.CodeBadRequest
		}
		return &wire.Error{Code: code, Message: se.Message, HttpStatus: uint32(se.Status)}
	}
	return err
}

// Health fails while the simulator is loading (simengine.Config.LoadTime),
// so that the agent stays warming as it does for an HTTP engine's /health.
func (a *Adapter) Health(context.Context) error { return a.e.Health() }

// Load reports the simulator's queue.
func (a *Adapter) Load(context.Context) (agent.Load, error) {
	l := a.e.Load()
	return agent.Load{Running: l.Running, Waiting: l.Waiting, KVCacheUsage: l.KVUsage}, nil
}

// Embed answers an embeddings request from the simulator, as its HTTP
// server would: the answer, or its refusal with status and OpenAI error
// body (404 when configured without embeddings).
func (a *Adapter) Embed(_ context.Context, r *agent.Request) (int, []byte, error) {
	out, err := a.e.Embed(r.Body)
	var se *simengine.Error
	switch {
	case err == nil:
		return http.StatusOK, out, nil
	case errors.As(err, &se) && se.Status == http.StatusNotFound && se.Param != "model":
		return 0, nil, &wire.Error{Code: wire.CodeUnsupportedAPI, Message: "the agent's engine (sim) does not serve embeddings: " + se.Message, HttpStatus: http.StatusNotFound}
	case errors.As(err, &se):
		body, _ := json.Marshal(map[string]any{"error": map[string]any{"message": se.Message, "type": se.Type, "param": nilIfEmpty(se.Param), "code": nilIfEmpty(se.Code)}})
		return se.Status, body, nil
	}
	return 0, nil, err
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}
