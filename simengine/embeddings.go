package simengine

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Embedding limits of the simulator.
const (
	// DefaultEmbeddingDims is the length of a vector when the request sets
	// no "dimensions".
	DefaultEmbeddingDims = 16
	maxEmbeddingDims     = 4096
	maxEmbeddingInputs   = 2048
)

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

type embeddingData struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

type embeddingResponse struct {
	ID      string          `json:"id"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Model   string          `json:"model"`
	Data    []embeddingData `json:"data"`
	Usage   struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

// Embed answers an OpenAI /v1/embeddings request body with deterministic
// unit vectors: the same input always gets the same vector, different
// inputs almost surely different ones, so tests can check what they get
// back. It returns the JSON answer, or an *Error in the OpenAI shape. An
// engine configured with NoEmbeddings answers 404, as vLLM does for a
// generation-only model.
func (e *Engine) Embed(body []byte) ([]byte, error) {
	if e.cfg.NoEmbeddings {
		return nil, &Error{Status: http.StatusNotFound, Type: "not_found_error", Message: "no route for /v1/embeddings"}
	}
	var r embeddingRequest
	if err := decode(body, &r); err != nil {
		return nil, err
	}
	if r.Model != "" && r.Model != e.cfg.Model {
		return nil, modelNotFound(r.Model)
	}
	dims := DefaultEmbeddingDims
	if r.Dimensions != nil {
		if *r.Dimensions < 1 || *r.Dimensions > maxEmbeddingDims {
			return nil, badRequest("dimensions", "dimensions must be between 1 and %d", maxEmbeddingDims)
		}
		dims = *r.Dimensions
	}
	if r.EncodingFormat != "" && r.EncodingFormat != "float" && r.EncodingFormat != "base64" {
		return nil, badRequest("encoding_format", "encoding_format must be float or base64")
	}
	items, tokens, perr := embeddingInputs(r.Input)
	if perr != nil {
		return nil, perr
	}
	resp := embeddingResponse{ID: "embd-" + randomHex(), Object: "list", Created: time.Now().Unix(), Model: e.cfg.Model}
	for i, item := range items {
		vec := embedVector(item, dims)
		d := embeddingData{Object: "embedding", Index: i, Embedding: vec}
		if r.EncodingFormat == "base64" {
			buf := make([]byte, 4*len(vec))
			for j, v := range vec {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
			}
			d.Embedding = base64.StdEncoding.EncodeToString(buf)
		}
		resp.Data = append(resp.Data, d)
	}
	resp.Usage.PromptTokens, resp.Usage.TotalTokens = tokens, tokens
	return json.Marshal(resp)
}

// embeddingInputs splits an "input" into its items (each as its canonical
// JSON, the seed of its vector) and counts its tokens: a string, an array
// of strings, an array of token ids, or an array of such arrays.
func embeddingInputs(raw json.RawMessage) ([][]byte, int, *Error) {
	if isNull(raw) {
		return nil, 0, badRequest("input", "input is required")
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, 0, badRequest("input", "input must not be empty")
		}
		return [][]byte{[]byte(one)}, textTokens(one), nil
	}
	var many []json.RawMessage
	if json.Unmarshal(raw, &many) != nil || len(many) == 0 {
		return nil, 0, badRequest("input", "input must be a non-empty string or array")
	}
	if len(many) > maxEmbeddingInputs {
		return nil, 0, badRequest("input", "at most %d inputs", maxEmbeddingInputs)
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return [][]byte{raw}, len(ids), nil // one prompt of token ids
	}
	items := make([][]byte, 0, len(many))
	tokens := 0
	for i, m := range many {
		var s string
		var t []int64
		switch {
		case json.Unmarshal(m, &s) == nil && s != "":
			items = append(items, []byte(s))
			tokens += textTokens(s)
		case json.Unmarshal(m, &t) == nil && len(t) > 0:
			items = append(items, bytes.TrimSpace(m))
			tokens += len(t)
		default:
			return nil, 0, badRequest("input", "input[%d] must be a non-empty string or array of token ids", i)
		}
	}
	return items, tokens, nil
}

// textTokens is the simulator's token count of a text: about four bytes a
// token, as English runs.
func textTokens(s string) int { return max(1, (len(s)+3)/4) }

// embedVector is a unit vector drawn from a generator seeded by the input.
func embedVector(item []byte, dims int) []float32 {
	h := fnv.New64a()
	_, _ = h.Write(item)
	state := h.Sum64()
	vec := make([]float32, dims)
	var norm float64
	for i := range vec {
		// splitmix64
		state += 0x9e3779b97f4a7c15
		z := state
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		v := float64(z>>11)/float64(1<<53)*2 - 1
		vec[i] = float32(v)
		norm += v * v
	}
	if norm = math.Sqrt(norm); norm > 0 {
		for i := range vec {
			vec[i] = float32(float64(vec[i]) / norm)
		}
	}
	return vec
}

func randomHex() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(time.Now().UnixNano()))
	return hex.EncodeToString(b[:])
}

// embeddings serves POST /v1/embeddings.
func (e *Engine) embeddings(w http.ResponseWriter, hr *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBodyBytes))
	if err != nil {
		writeError(w, &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: "reading body: " + err.Error()})
		return
	}
	out, err := e.Embed(body)
	if err != nil {
		var se *Error
		if !errors.As(err, &se) {
			se = &Error{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
		}
		writeError(w, se)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	_, _ = w.Write(out)
}
