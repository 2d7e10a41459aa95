package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/switchyard-ai/switchyard/internal/agentcmd"
	"github.com/switchyard-ai/switchyard/internal/cmdtest"
	"github.com/switchyard-ai/switchyard/simengine"
)

// TestModelRetrieve drives GET /v1/models/{id} through the official SDK's
// models.retrieve with a model id holding '/', and by hand with the '/'
// unescaped, as curl users write it.
func TestModelRetrieve(t *testing.T) {
	const id = "meta-llama/Llama-3.1-8B"
	b := cmdtest.StartBroker(t)
	e := startEngine(t, simengine.Config{Model: id, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 2})
	startAgent(t, b.NATS, "a1", e, 2)
	cmdtest.WaitEligible(t, b.HTTP, "a1")
	client := sdk(b.HTTP)
	ctx := context.Background()

	got, err := client.Models.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != id || got.Object != "model" || got.OwnedBy == "" {
		t.Fatalf("model %+v", got)
	}

	for _, tc := range []struct {
		name, path string
		status     int
	}{
		{"slash as sent", "/v1/models/" + id, http.StatusOK},
		{"slash escaped", "/v1/models/meta-llama%2FLlama-3.1-8B", http.StatusOK},
		{"unknown", "/v1/models/meta-llama/Llama-3.1-70B", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Get(b.HTTP + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, tc.status, body)
			}
			if tc.status == http.StatusOK {
				for _, k := range []string{"id", "object", "created", "owned_by"} {
					if _, ok := body[k]; !ok {
						t.Fatalf("member %q missing: %v", k, body)
					}
				}
				return
			}
			e, _ := body["error"].(map[string]any)
			if e["code"] != "model_not_found" || e["type"] != "invalid_request_error" || e["message"] == "" {
				t.Fatalf("error body %v", body)
			}
		})
	}

	_, err = client.Models.Get(ctx, "no/such-model")
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model: %v", err)
	}
}

// TestEmbeddings drives POST /v1/embeddings through the official SDK
// against agents of HTTP and in-process simulated engines: the answer is
// the engine's own, byte for byte in its vectors; the engine's refusal of
// a request reaches the client as the engine wrote it; an engine without
// embeddings is a clear 501, never a hang.
func TestEmbeddings(t *testing.T) {
	b := cmdtest.StartBroker(t)
	cfg := simengine.Config{Model: model, TTFT: time.Millisecond, ITL: time.Millisecond, Slots: 2}
	startAgent(t, b.NATS, "http-sim", startEngine(t, cfg), 2)
	noEmb := cfg
	noEmb.Model, noEmb.NoEmbeddings = "generate-only", true
	startAgent(t, b.NATS, "no-embeddings", startEngine(t, noEmb), 2)
	cmdtest.Start(t, agentcmd.Run, "--nats-url", b.NATS, "--engine", "sim", "--model", "inproc-model", "--id", "inproc",
		"--slots", "2", "--heartbeat", liveHeartbeat, "--log-level", "warn")
	cmdtest.WaitEligible(t, b.HTTP, "http-sim", "no-embeddings", "inproc")
	client := sdk(b.HTTP)
	ctx := context.Background()

	// The simulator's vectors are a function of the input: its own answer
	// is what the client must get.
	ref, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ref.Close() })

	for _, tc := range []struct {
		name, model string
		inputs      []string
		dims        int64
	}{
		{"http engine", model, []string{"the quick brown fox", "jumps over"}, 0},
		{"http engine dimensions", model, []string{"a", "b", "c"}, 8},
		{"in-process engine", "inproc-model", []string{"the quick brown fox"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := openai.EmbeddingNewParams{
				Model: openai.EmbeddingModel(tc.model),
				Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: tc.inputs},
			}
			raw := map[string]any{"model": model, "input": tc.inputs}
			if tc.dims > 0 {
				params.Dimensions = openai.Int(tc.dims)
				raw["dimensions"] = tc.dims
			}
			var resp *http.Response
			got, err := client.Embeddings.New(ctx, params, withResponse(&resp))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(raw)
			wantJSON, err := ref.Embed(body)
			if err != nil {
				t.Fatal(err)
			}
			var want openai.CreateEmbeddingResponse
			if err := json.Unmarshal(wantJSON, &want); err != nil {
				t.Fatal(err)
			}
			if len(got.Data) != len(tc.inputs) {
				t.Fatalf("%d vectors for %d inputs", len(got.Data), len(tc.inputs))
			}
			for i := range got.Data {
				if got.Data[i].Index != int64(i) || !slices.Equal(got.Data[i].Embedding, want.Data[i].Embedding) {
					t.Fatalf("vector %d: %v, want %v", i, got.Data[i].Embedding, want.Data[i].Embedding)
				}
			}
			if got.Usage.PromptTokens != want.Usage.PromptTokens || got.Usage.PromptTokens == 0 {
				t.Fatalf("usage %+v, want %+v", got.Usage, want.Usage)
			}
			if r := resp.Header.Get("X-Switchyard-Route"); r != "regular" {
				t.Fatalf("route %q", r)
			}
		})
	}

	for _, tc := range []struct {
		name, body string
		status     int
		param      string // the error's param
		message    string // part of the error's message
	}{
		{"no input", `{"model":"sim-model"}`, http.StatusBadRequest, "input", "input is required"},
		{"empty string", `{"model":"sim-model","input":""}`, http.StatusBadRequest, "input", "empty"},
		{"bad item", `{"model":"sim-model","input":["ok",3.5]}`, http.StatusBadRequest, "input[1]", "input[1]"},
		{"bad format", `{"model":"sim-model","input":"x","encoding_format":"int8"}`, http.StatusBadRequest, "encoding_format", "encoding_format"},
		// Valid for the broker, refused by the engine: its own words.
		{"engine refuses", `{"model":"sim-model","input":"x","dimensions":5000}`, http.StatusBadRequest, "dimensions", "between 1 and 4096"},
		{"engine without embeddings", `{"model":"generate-only","input":"x"}`, http.StatusNotImplemented, "", "does not serve embeddings"},
		{"unknown model", `{"model":"nope","input":"x"}`, http.StatusNotFound, "model", "nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(b.HTTP+"/v1/embeddings", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, _ := io.ReadAll(resp.Body)
			var e struct {
				Error struct {
					Message string  `json:"message"`
					Param   *string `json:"param"`
				} `json:"error"`
			}
			if err := json.Unmarshal(data, &e); err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if resp.StatusCode != tc.status || param != tc.param || !strings.Contains(e.Error.Message, tc.message) {
				t.Fatalf("status %d param %q: %s; want %d, %q, %q", resp.StatusCode, param, data, tc.status, tc.param, tc.message)
			}
		})
	}
}
