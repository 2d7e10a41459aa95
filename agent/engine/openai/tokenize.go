package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

var _ agent.PromptTokenizer = (*Adapter)(nil)

// maxTokenizeBytes bounds a /tokenize answer: ids and token strings of a
// long prompt.
const maxTokenizeBytes = 64 << 20

// TokenizePrompt asks the engine's vLLM /tokenize to tokenize a request's
// prompt as it runs it (chat template applied), with token strings. It
// opens a connection of its own when every kept-alive one is busy (the
// transport bounds idle connections, not open ones), so it never waits for
// a connection a job holds.
func (a *Adapter) TokenizePrompt(ctx context.Context, api wire.API, body []byte) (oaiformat.TokenizeResponse, error) {
	var out oaiformat.TokenizeResponse
	tb, err := oaiformat.TokenizeBody(api, body)
	if err != nil {
		return out, fmt.Errorf("tokenize: %w", err)
	}
	req, err := a.newRequest(ctx, http.MethodPost, "/tokenize", tb)
	if err != nil {
		return out, err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out, statusError(resp)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenizeBytes)).Decode(&out); err != nil {
		return out, fmt.Errorf("tokenize answer: %w", err)
	}
	return out, nil
}
