package simengine

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-ai/switchyard/oaiformat"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 32 << 20

// Handler serves the vLLM-compatible HTTP API:
//
//	POST /v1/chat/completions
//	POST /v1/completions
//	POST /v1/embeddings (deterministic vectors; see Engine.Embed)
//	GET  /v1/models
//	POST /tokenize (vLLM's: the simulator's tokenizer, with token strings)
//	GET  /server_info, /get_server_info (SGLang's, with the bootstrap port)
//	GET  /health
//	GET  /metrics
//
// Errors are written in the OpenAI error shape. Until the engine is
// loaded ([Config.LoadTime]) every route but /metrics answers 503.
func (e *Engine) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/chat/completions", allow(http.MethodPost, e.completions(APIChat)))
	mux.Handle("/v1/completions", allow(http.MethodPost, e.completions(APICompletion)))
	mux.Handle("/v1/models", allow(http.MethodGet, e.whenLoaded(http.HandlerFunc(e.models))))
	mux.Handle("/tokenize", allow(http.MethodPost, e.whenLoaded(http.HandlerFunc(e.tokenize))))
	mux.Handle("/server_info", allow(http.MethodGet, http.HandlerFunc(e.serverInfo)))
	mux.Handle("/get_server_info", allow(http.MethodGet, http.HandlerFunc(e.serverInfo)))
	if !e.cfg.NoEmbeddings {
		mux.Handle("/v1/embeddings", allow(http.MethodPost, e.whenLoaded(http.HandlerFunc(e.embeddings))))
	}
	mux.Handle("/health", allow(http.MethodGet, e.whenLoaded(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))))
	mux.Handle("/metrics", allow(http.MethodGet, promhttp.HandlerFor(e.registry, promhttp.HandlerOpts{})))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &Error{
			Status:  http.StatusNotFound,
			Type:    "not_found_error",
			Message: "no route for " + r.URL.Path,
		})
	})
	return mux
}

// whenLoaded answers 503 until the engine is loaded. The completion routes
// need no wrapper: [Engine.check] refuses their requests.
func (e *Engine) whenLoaded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !e.Loaded() {
			writeError(w, e.loadingError())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// allow answers 405 in the OpenAI error shape for any other method (GET also
// allows HEAD).
func allow(method string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Allow", method)
		writeError(w, &Error{
			Status:  http.StatusMethodNotAllowed,
			Type:    "invalid_request_error",
			Message: "method " + r.Method + " not allowed, use " + method,
		})
	})
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func errorJSON(e *Error) []byte {
	b, _ := json.Marshal(errorBody{Error: errorDetail{
		Message: e.Message,
		Type:    e.Type,
		Param:   optional(e.Param),
		Code:    optional(e.Code),
	}})
	return b
}

func writeError(w http.ResponseWriter, e *Error) {
	b := errorJSON(e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(b, '\n'))
}

func (e *Engine) completions(api API) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBodyBytes))
		if err != nil {
			status := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				status = http.StatusRequestEntityTooLarge
			}
			writeError(w, &Error{Status: status, Type: "invalid_request_error", Message: "reading body: " + err.Error()})
			return
		}
		r, rerr := e.check(api, body)
		if rerr != nil {
			writeError(w, rerr)
			return
		}
		if r.stream {
			e.serveStream(w, hr, r)
			return
		}
		s := e.newTextSink(r)
		if err := e.run(hr.Context(), r, s); err != nil {
			if re, ok := errors.AsType[*Error](err); ok {
				writeError(w, re) // a refused room or a failed hand-off
			}
			return // otherwise the client is gone
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(s.out)))
		_, _ = w.Write(s.out)
	})
}

var (
	sseData = []byte("data: ")
	sseEnd  = []byte("\n\n")
	sseDone = []byte("data: [DONE]\n\n")
)

func (e *Engine) serveStream(w http.ResponseWriter, hr *http.Request, r *request) {
	rc := http.NewResponseController(w)
	s := e.newChunkSink(r, func(chunk []byte) error {
		if _, err := w.Write(sseData); err != nil {
			return err
		}
		if _, err := w.Write(chunk); err != nil {
			return err
		}
		if _, err := w.Write(sseEnd); err != nil {
			return err
		}
		return rc.Flush()
	})
	// Headers go out as soon as the request is accepted, so that a client
	// knows it is queued rather than lost.
	opened := false
	s.onOpen = func() error {
		opened = true
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		return rc.Flush()
	}
	if err := e.run(hr.Context(), r, s); err != nil {
		re, ok := errors.AsType[*Error](err)
		if !ok {
			return // the client is gone
		}
		if !opened {
			writeError(w, re)
			return
		}
		// As vLLM does once a stream has started: an error event, then
		// [DONE].
		if _, err := w.Write(sseData); err != nil {
			return
		}
		_, _ = w.Write(errorJSON(re))
		_, _ = w.Write(sseEnd)
	}
	if _, err := w.Write(sseDone); err == nil {
		_ = rc.Flush()
	}
}

func (e *Engine) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	b, _ := json.Marshal(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: e.cfg.Model, Object: "model", Created: time.Now().Unix(), OwnedBy: "switchyard-sim"}}})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// tokenize is vLLM's /tokenize: a prompt, or messages rendered with the
// engine's chat template (ChatML with KVHashTokens, the simulator's own
// otherwise), encoded with the simulator's tokenizer. Token strings are
// spelled as a byte-level BPE vocabulary spells them ("Ġword"), as
// vLLM's convert_ids_to_tokens gives them for such tokenizers.
func (e *Engine) tokenize(w http.ResponseWriter, hr *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBodyBytes))
	if err != nil {
		writeError(w, badRequest("", "reading body: %v", err))
		return
	}
	var req struct {
		oaiformat.TokenizeRequest
		Messages []chatMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, badRequest("", "invalid request body: %v", err))
		return
	}
	if req.Model != "" && req.Model != e.cfg.Model {
		writeError(w, &Error{Status: http.StatusNotFound, Type: "NotFoundError", Code: "model_not_found",
			Message: "the model `" + req.Model + "` does not exist"})
		return
	}
	var text string
	switch {
	case req.Messages != nil:
		msgs, rerr := chatTexts(req.Messages)
		if rerr != nil {
			writeError(w, rerr)
			return
		}
		if len(msgs) == 0 {
			writeError(w, badRequest("messages", "messages must be a non-empty array"))
			return
		}
		gen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		if e.cfg.KVHash == KVHashTokens {
			text = renderChatML(msgs, gen && !req.ContinueFinalMessage, req.ContinueFinalMessage)
		} else {
			text = renderChat(msgs, req.ContinueFinalMessage)
		}
	case req.Prompt != nil:
		text = *req.Prompt
	default:
		writeError(w, badRequest("prompt", "either prompt or messages is required"))
		return
	}
	tok := simTokenizer()
	ids, err := tok.Encode(text)
	if err != nil {
		writeError(w, badRequest("", "%v", err))
		return
	}
	out := oaiformat.TokenizeResponse{Count: len(ids), MaxModelLen: MaxTokensLimit, Tokens: ids}
	if out.Tokens == nil {
		out.Tokens = []uint32{}
	}
	if req.ReturnTokenStrs {
		out.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			b, _ := tok.Token(id)
			out.TokenStrs[i] = oaiformat.ByteLevelTokenStr(b)
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
