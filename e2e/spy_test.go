package e2e

import (
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard-ai/switchyard/simengine"
)

// spyEngine is a simulated engine behind a recorder: it keeps the method,
// path, Authorization header and answer status of every request, and can
// demand an API key on /v1/ routes as vLLM's --api-key does (not on
// /health). The key can change while it runs, as when an operator rotates
// the engine's key and not the agent's.
type spyEngine struct {
	*simengine.Engine
	URL string

	mu   sync.Mutex
	key  string
	reqs []spyRequest
}

type spyRequest struct {
	Method, Path, Auth string
	Status             int
}

func startSpy(t testing.TB, cfg simengine.Config, key string) *spyEngine {
	t.Helper()
	se, err := simengine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &spyEngine{Engine: se, key: key}
	h := se.Handler()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			s.mu.Lock()
			s.reqs = append(s.reqs, spyRequest{r.Method, r.URL.Path, r.Header.Get("Authorization"), sw.status})
			s.mu.Unlock()
		}()
		s.mu.Lock()
		key := s.key
		s.mu.Unlock()
		if key != "" && strings.HasPrefix(r.URL.Path, "/v1/") && r.Header.Get("Authorization") != "Bearer "+key {
			sw.Header().Set("Content-Type", "application/json")
			sw.WriteHeader(http.StatusUnauthorized)
			_, _ = sw.Write([]byte(`{"error":"Unauthorized"}`)) // vLLM's answer
			return
		}
		h.ServeHTTP(sw, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); _ = se.Close() })
	s.URL = "http://" + ln.Addr().String()
	return s
}

// setKey changes the key the engine demands.
func (s *spyEngine) setKey(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = k
}

// count returns how many requests matched method, path and status.
func (s *spyEngine) count(method, path string, status int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.reqs {
		if r.Method == method && r.Path == path && r.Status == status {
			n++
		}
	}
	return n
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
