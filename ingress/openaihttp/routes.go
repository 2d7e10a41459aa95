package openaihttp

import "net/http"

// routes lists every HTTP route of the broker in one place.
func (s *Server) routes() {
	s.handle("/v1/chat/completions", http.MethodPost, withSLO(s.completions(chatAPI)))
	s.handle("/v1/completions", http.MethodPost, withSLO(s.completions(completionAPI)))
	s.handle("/v1/models", http.MethodGet, s.models)
	s.handle("/v1/models/{id...}", http.MethodGet, s.model)
	s.handle("/v1/embeddings", http.MethodPost, s.embeddings)
	s.handle("/v1/fleet", http.MethodGet, s.fleet)
	if s.cfg.Batch != nil {
		s.handleEach("/v1/files", map[string]http.HandlerFunc{http.MethodGet: s.listFiles, http.MethodPost: s.createFile})
		s.handleEach("/v1/files/{id}", map[string]http.HandlerFunc{http.MethodGet: s.getFile, http.MethodDelete: s.deleteFile})
		s.handle("/v1/files/{id}/content", http.MethodGet, s.fileContent)
		s.handleEach("/v1/batches", map[string]http.HandlerFunc{http.MethodGet: s.listBatches, http.MethodPost: s.createBatch})
		s.handle("/v1/batches/{id}", http.MethodGet, s.getBatch)
		s.handle("/v1/batches/{id}/cancel", http.MethodPost, s.cancelBatch)
	}
	s.handle("/healthz", http.MethodGet, s.healthz)
	s.handle("/readyz", http.MethodGet, s.readyz)
	if s.cfg.Metrics != nil {
		s.handle("/metrics", http.MethodGet, s.cfg.Metrics.ServeHTTP)
	}
	if s.cfg.Page != nil {
		s.mux.Handle("GET /{$}", s.cfg.Page)
		s.mux.Handle("GET /ui/", s.cfg.Page)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{Status: http.StatusNotFound, Message: "no route " + r.Method + " " + r.URL.Path, Type: "invalid_request_error", Code: strp("not_found")})
	})
}

// handle registers h for exactly one method; others get 405 in OpenAI's shape.
func (s *Server) handle(path, method string, h http.HandlerFunc) {
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", method)
			writeError(w, &apiError{Status: http.StatusMethodNotAllowed, Message: r.Method + " not allowed on " + path + "; use " + method, Type: "invalid_request_error", Code: strp("method_not_allowed")})
			return
		}
		h(w, r)
	})
}
