package fleetui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	h := Handler()
	tests := []struct {
		name     string
		method   string
		path     string
		status   int
		ctype    string
		contains string
	}{
		{name: "page at root", method: "GET", path: "/", status: 200, ctype: "text/html", contains: `id="agents-body"`},
		{name: "page at prefix", method: "GET", path: "/ui/", status: 200, ctype: "text/html", contains: `src="/ui/fleet.js"`},
		{name: "script", method: "GET", path: "/ui/fleet.js", status: 200, ctype: "text/javascript", contains: "/v1/fleet"},
		{name: "stylesheet", method: "GET", path: "/ui/fleet.css", status: 200, ctype: "text/css", contains: ".badge.draining"},
		{name: "head", method: "HEAD", path: "/ui/fleet.css", status: 200, ctype: "text/css"},
		{name: "unknown asset", method: "GET", path: "/ui/nope.js", status: 404},
		{name: "no directory listing", method: "GET", path: "/ui/assets/", status: 404},
		{name: "post", method: "POST", path: "/", status: 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d", rec.Code, tt.status)
			}
			if tt.ctype != "" && !strings.HasPrefix(rec.Header().Get("Content-Type"), tt.ctype) {
				t.Errorf("Content-Type %q, want %s", rec.Header().Get("Content-Type"), tt.ctype)
			}
			if tt.method == "HEAD" && rec.Body.Len() != 0 {
				t.Errorf("HEAD has a body of %d bytes", rec.Body.Len())
			}
			if tt.contains != "" && !strings.Contains(rec.Body.String(), tt.contains) {
				t.Errorf("body lacks %q", tt.contains)
			}
		})
	}
}

// TestAssetsSelfContained guards the offline promise: nothing the page loads
// or fetches lives on another origin.
func TestAssetsSelfContained(t *testing.T) {
	srv := httptest.NewServer(Handler())
	defer srv.Close()
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?(https?:)?//|fetch\(\s*["'](https?:)?//`)
	for _, p := range []string{"/", "/ui/fleet.js", "/ui/fleet.css"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another origin: %q", p, m)
		}
	}
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}
