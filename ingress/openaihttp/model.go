package openaihttp

import (
	"net/http"
	"slices"
)

// model serves GET /v1/models/{id} (the SDKs' models.retrieve) in OpenAI's
// model object shape. Model ids hold '/' (meta-llama/Llama-3.1-8B): the
// route takes the rest of the path, as sent or with the '/' escaped.
func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !slices.Contains(s.backend.Models(), id) {
		writeError(w, &apiError{Status: http.StatusNotFound, Message: "The model '" + id + "' does not exist or is not served here", Type: "invalid_request_error", Param: strp("model"), Code: strp("model_not_found")})
		return
	}
	writeJSON(w, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}{id, "model", 0, "switchyard"})
}
