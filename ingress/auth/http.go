package auth

import (
	"net/http"
)

// Bodies of the 401 answers, in OpenAI's error shape so SDKs surface them
// as an authentication error. The presented key is never echoed.
const (
	missingKeyBody = `{"error":{"message":"Missing API key: send it as an Authorization: Bearer <key> header.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}` + "\n"
	invalidKeyBody = `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}` + "\n"
)

// HTTP requires a valid "Authorization: Bearer <key>" on every request
// except those whose path is exactly one of exempt (health probes such as
// /healthz and /readyz). A request without one gets 401 with
// WWW-Authenticate: Bearer and an OpenAI-shaped error. The Authorization
// header is removed before next runs, so the key cannot reach a job, an
// engine or a log line; the request's context carries the key's Owner.
// With no keys configured, next is returned as is.
func (k *Keys) HTTP(next http.Handler, exempt ...string) http.Handler {
	if !k.Enabled() {
		return next
	}
	skip := make(map[string]bool, len(exempt))
	for _, p := range exempt {
		skip[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if skip[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		key, ok := bearer(r.Header.Get("Authorization"))
		switch {
		case !ok:
			unauthorized(w, `Bearer`, missingKeyBody)
			return
		case !k.Valid(key):
			unauthorized(w, `Bearer error="invalid_token"`, invalidKeyBody)
			return
		}
		r.Header.Del("Authorization")
		next.ServeHTTP(w, r.WithContext(WithOwner(r.Context(), ownerOf(key))))
	})
}

func unauthorized(w http.ResponseWriter, challenge, body string) {
	h := w.Header()
	h.Set("WWW-Authenticate", challenge)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte(body))
}
