package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/wire"
)

// WithModel names the model the agent serves: the health probe checks that
// the engine lists it, and a 404 naming a model is then read as the engine
// serving another one.
func WithModel(id string) Option { return func(a *Adapter) { a.model = id } }

// refusal classifies an engine's refusal of a request the agent sent on
// path. A 401 or 403 is a wrong (or missing) engine API key and a 404 that
// speaks of a model is an engine serving another model: the agent's
// configuration, not the client's request, so they are not passed on as
// the client's 4xx (an SDK would read a 401 as its own bad key) but taken
// by the agent as a reason to stop serving. A 404 or 405 that does not
// speak of a model is a route the engine lacks. It returns nil for
// refusals that judge the request itself.
func (a *Adapter) refusal(status int, path, msg string) *wire.Error {
	msg = strings.TrimPrefix(msg, fmt.Sprintf("engine answered %d: ", status))
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return &wire.Error{
			Code:       wire.CodeEngineMisconfigured,
			Message:    fmt.Sprintf("engine answered %d %s to %s: check the agent's --engine-api-key (the engine said: %s)", status, http.StatusText(status), path, msg),
			HttpStatus: uint32(status),
		}
	case status == http.StatusNotFound && strings.Contains(strings.ToLower(msg), "model"):
		want := ""
		if a.model != "" {
			want = fmt.Sprintf(" %q", a.model)
		}
		return &wire.Error{
			Code:       wire.CodeEngineMisconfigured,
			Message:    fmt.Sprintf("engine answered 404 to %s: it does not serve the model%s: check the agent's --model and the engine's served model name (the engine said: %s)", path, want, msg),
			HttpStatus: uint32(status),
		}
	case status == http.StatusNotFound || status == http.StatusMethodNotAllowed:
		return &wire.Error{
			Code:       wire.CodeUnsupportedAPI,
			Message:    fmt.Sprintf("the agent's engine does not serve POST %s (it answered %d %s)", path, status, http.StatusText(status)),
			HttpStatus: uint32(status),
		}
	}
	return nil
}

// checkModels is the authenticated half of the health probe: /health
// usually answers without a key, so a wrong key would pass it and fail
// every request. GET /v1/models needs the key where the engine has one
// (vLLM and SGLang guard /v1/ with --api-key) and lists what the engine
// serves. An engine without /v1/models cannot tell, and passes.
func (a *Adapter) checkModels(ctx context.Context) error {
	req, err := a.newRequest(ctx, http.MethodGet, "/v1/models", nil)
	if err != nil {
		return err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("engine models: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return nil
	default:
		err := statusError(resp)
		if we := a.refusal(resp.StatusCode, "GET /v1/models", err.GetMessage()); we != nil && we.Code == wire.CodeEngineMisconfigured {
			return we
		}
		return err
	}
	if a.model == "" {
		return nil
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&list); err != nil {
		return fmt.Errorf("engine models: %w", err)
	}
	ids := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if slices.Contains(ids, a.model) {
		return nil
	}
	return &wire.Error{
		Code:    wire.CodeEngineMisconfigured,
		Message: fmt.Sprintf("engine serves %s, not %q: check the agent's --model and the engine's served model name", strings.Join(ids, ", "), a.model),
	}
}

// defaultMaxEmbedding bounds an embeddings answer when the request says
// nothing of it.
const defaultMaxEmbedding = 64 << 20

// jsonAnswer reports whether an answer with Content-Type ct is one JSON
// object.
func jsonAnswer(ct string, body []byte) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
		return false
	}
	body = bytes.TrimSpace(body)
	return len(body) > 0 && body[0] == '{' && json.Valid(body)
}

// Embed relays an embeddings request to the engine's /v1/embeddings as is
// and returns the engine's answer as is. Refusals of the agent itself (see
// refusal) and a route the engine lacks come back as errors instead.
func (a *Adapter) Embed(ctx context.Context, r *agent.Request) (int, []byte, error) {
	const path = "/v1/embeddings"
	req, err := a.newRequest(ctx, http.MethodPost, path, r.Body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		return 0, nil, &wire.Error{Code: wire.CodeEngineDown, Message: err.Error()}
	}
	defer resp.Body.Close()
	// Bounded by what the agent relays (and a NATS message carries back):
	// a larger answer is refused having read one byte past the bound.
	limit := r.MaxAnswer
	if limit <= 0 {
		limit = defaultMaxEmbedding
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil && ctx.Err() != nil:
		return 0, nil, ctx.Err()
	case err != nil:
		return 0, nil, &wire.Error{Code: wire.CodeEngine, Message: "reading the engine's embeddings answer: " + err.Error()}
	case int64(len(body)) > limit:
		return 0, nil, &wire.Error{Code: wire.CodeEngineOutputTooLarge, Message: fmt.Sprintf("engine %s: embeddings answer larger than the %d bytes the agent relays", a.base, limit)}
	}
	if resp.StatusCode == http.StatusOK && !jsonAnswer(resp.Header.Get("Content-Type"), body) {
		// Relayed as application/json, it would be the engine's error page
		// passed off as an answer.
		return 0, nil, &wire.Error{Code: wire.CodeEngine, Message: fmt.Sprintf("engine %s answered 200 with %q that is not a JSON object", a.base, resp.Header.Get("Content-Type"))}
	}
	if resp.StatusCode != http.StatusOK {
		if we := a.refusal(resp.StatusCode, path, wire.EngineText(string(body))); we != nil {
			if we.Code == wire.CodeUnsupportedAPI {
				we.Message = "the agent's engine does not serve embeddings: " + we.Message
			}
			return 0, nil, we
		}
	}
	return resp.StatusCode, body, nil
}
