package openaihttp

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/switchyard-ai/switchyard/batch"
	"github.com/switchyard-ai/switchyard/ingress/auth"
)

func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) {
	body, berr := s.readBody(w, r)
	if berr != nil {
		writeError(w, berr)
		return
	}
	var p struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		writeError(w, invalid("the body must be a JSON object: "+err.Error(), "", "invalid_json"))
		return
	}
	b, err := s.cfg.Batch.CreateBatch(r.Context(), auth.Owner(r.Context()), batch.NewBatch{
		InputFileID: p.InputFileID, Endpoint: p.Endpoint, CompletionWindow: p.CompletionWindow, Metadata: p.Metadata,
	})
	if err != nil {
		writeError(w, fromBatch(err, "batch"))
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) getBatch(w http.ResponseWriter, r *http.Request) {
	b, err := s.cfg.Batch.Batch(r.Context(), auth.Owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, fromBatch(err, "batch"))
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (s *Server) listBatches(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, invalid("limit: want 1 to 100", "limit", "invalid_value"))
			return
		}
		limit = n
	}
	bs, more, err := s.cfg.Batch.Batches(r.Context(), auth.Owner(r.Context()), q.Get("after"), limit)
	if err != nil {
		writeError(w, fromBatch(err, "batch"))
		return
	}
	writeJSON(w, http.StatusOK, page(bs, func(b *batch.Batch) string { return b.ID }, more))
}

func (s *Server) cancelBatch(w http.ResponseWriter, r *http.Request) {
	b, err := s.cfg.Batch.CancelBatch(r.Context(), auth.Owner(r.Context()), r.PathValue("id"))
	if err != nil {
		writeError(w, fromBatch(err, "batch"))
		return
	}
	writeJSON(w, http.StatusOK, b)
}
