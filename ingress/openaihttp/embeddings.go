package openaihttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/oaiformat"
	"github.com/switchyard-ai/switchyard/wire"
)

// Limits of an embeddings request, as OpenAI's API sets them.
const (
	maxEmbeddingInputs = 2048
	maxEmbeddingDims   = 65536
)

// embeddingsNeed keeps embeddings off the PD pipeline: no PD adapter
// serves them, so they go to the regular pool or fail with a clear error.
const embeddingsNoPD = "embeddings are served by the regular pool only"

// embeddingRequest holds what the broker checks; the body travels to the
// engine unchanged.
type embeddingRequest struct {
	Model          *string         `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat *string         `json:"encoding_format"`
	Dimensions     *int64          `json:"dimensions"`
}

// parseEmbeddings validates an embeddings request and returns its model.
func parseEmbeddings(body []byte) (string, *apiError) {
	if !utf8.Valid(body) {
		return "", invalid("request body is not valid UTF-8", "", "invalid_encoding")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	var r embeddingRequest
	if err := dec.Decode(&r); err != nil {
		return "", fromFormat(oaiformat.CheckJSON(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", invalid("request body has data after the JSON object", "", "invalid_json")
	}
	model := ""
	if r.Model != nil {
		model = *r.Model
		if len(model) > oaiformat.MaxModelLen {
			return "", invalid(fmt.Sprintf("model id longer than %d bytes", oaiformat.MaxModelLen), "model", "invalid_value")
		}
	}
	if err := checkEmbeddingInput(r.Input); err != nil {
		return "", err
	}
	if f := r.EncodingFormat; f != nil && *f != "float" && *f != "base64" {
		return "", invalid("encoding_format must be float or base64", "encoding_format", "invalid_value")
	}
	if d := r.Dimensions; d != nil && (*d < 1 || *d > maxEmbeddingDims) {
		return "", invalid(fmt.Sprintf("dimensions must be between 1 and %d", maxEmbeddingDims), "dimensions", "invalid_value")
	}
	return model, nil
}

// checkEmbeddingInput accepts what OpenAI's API does: a non-empty string,
// or a non-empty array of non-empty strings, of token ids, or of non-empty
// arrays of token ids.
func checkEmbeddingInput(raw json.RawMessage) *apiError {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return invalid("input is required", "input", "invalid_value")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return invalid("input must not be an empty string", "input", "invalid_value")
		}
		return nil
	}
	if raw[0] != '[' {
		return invalid("input must be a string or an array", "input", "invalid_type")
	}
	// Walked element by element, not past the bound: a long array of
	// tiny items is refused having read the bound's worth of it.
	n, ints, firstInt, firstBad := 0, 0, -1, -1
	err := oaiformat.Elements(raw, maxEmbeddingInputs, func(i int, m json.RawMessage) error {
		n++
		var id int64
		var s string
		var t []int64
		switch {
		case json.Unmarshal(m, &id) == nil:
			ints++
			if firstInt < 0 {
				firstInt = i
			}
		case json.Unmarshal(m, &s) == nil && s != "":
		case json.Unmarshal(m, &t) == nil && len(t) > 0:
		default:
			if firstBad < 0 {
				firstBad = i
			}
		}
		return nil
	})
	if err != nil || n == 0 {
		return invalid(fmt.Sprintf("input must hold 1 to %d items", maxEmbeddingInputs), "input", "invalid_value")
	}
	// An array of token ids, or of strings and arrays of token ids: a
	// token id among the others is out of place.
	if ints == n || (ints == 0 && firstBad < 0) {
		return nil
	}
	bad := firstBad
	if firstInt >= 0 && (bad < 0 || firstInt < bad) {
		bad = firstInt
	}
	p := fmt.Sprintf("input[%d]", bad)
	return invalid(p+" must be a non-empty string or a non-empty array of token ids", p, "invalid_value")
}

// embeddings serves POST /v1/embeddings: validated, dispatched to the
// regular pool, relayed by the agent to its engine as is; the engine's
// answer comes back as is (its JSON, and its status when it refused the
// request).
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	rid := requestID(r)
	w.Header().Set("X-Request-Id", rid)
	body, berr := s.readBody(w, r)
	if berr != nil {
		writeError(w, berr)
		return
	}
	model, perr := parseEmbeddings(body)
	if perr != nil {
		writeError(w, perr)
		return
	}
	class, deadline := lineClass(r)
	call, err := s.backend.Submit(r.Context(), broker.Request{
		Class:           class,
		Deadline:        deadline,
		Model:           model,
		API:             wire.API_API_EMBEDDINGS,
		Body:            body,
		ClientRequestID: rid,
		NoPD:            true,
		NoPDReason:      embeddingsNoPD,
		NoMigration:     "embeddings",
		Trace:           traceContext(r),
	})
	if err != nil {
		writeError(w, fromBroker(err))
		return
	}
	defer call.Close()
	setRoute(w.Header(), call.Route)
	// The edge's write deadline starts with the response, not before the
	// wait for the engine: a 504 at the request's deadline is written too.
	for {
		c, err := call.Next(r.Context())
		if err != nil {
			if r.Context().Err() != nil {
				call.SetOutcome(broker.OutcomeCancelled)
				return
			}
			call.SetOutcome(broker.OutcomeError)
			writeError(w, fromBroker(err))
			return
		}
		switch c.GetKind() {
		case wire.Chunk_KIND_ACCEPTED:
			w.Header().Set("X-Switchyard-Agent", agentHeader(c))
		case wire.Chunk_KIND_FINAL:
			if raw := bytes.TrimSpace(c.GetRaw()); len(raw) == 0 || raw[0] != '{' || !json.Valid(raw) {
				// Relayed as application/json, it must be JSON.
				call.SetOutcome(broker.OutcomeError)
				writeError(w, &apiError{Status: http.StatusBadGateway, Message: "the engine's embeddings answer is not a JSON object", Type: "server_error", Code: strp("upstream_error")})
				return
			}
			writeRaw(w, http.StatusOK, c.GetRaw())
			return
		case wire.Chunk_KIND_ERROR:
			we := c.GetError()
			st := int(we.GetHttpStatus())
			if we.GetCode() == wire.CodeBadRequest && st >= 400 && st <= 599 && json.Valid(c.GetRaw()) {
				writeRaw(w, st, c.GetRaw()) // the engine's own refusal, as it wrote it
				return
			}
			writeError(w, fromWire(we))
			return
		}
	}
}

func writeRaw(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
