package openaihttp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-ai/switchyard/broker"
)

func TestSLOHeaders(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    broker.Targets
		bad     string // the header a 400 names
	}{
		{name: "none"},
		{name: "both", headers: map[string]string{"X-SLO-TTFT-MS": "1500", "x-slo-itl-ms": "12.5"}, want: broker.Targets{TTFT: 1500 * time.Millisecond, ITL: 12500 * time.Microsecond}},
		{name: "zero", headers: map[string]string{"x-slo-ttft-ms": "0"}, bad: HeaderSLOTTFT},
		{name: "negative", headers: map[string]string{"x-slo-itl-ms": "-3"}, bad: HeaderSLOITL},
		{name: "word", headers: map[string]string{"x-slo-itl-ms": "fast"}, bad: HeaderSLOITL},
		{name: "nan", headers: map[string]string{"x-slo-ttft-ms": "NaN"}, bad: HeaderSLOTTFT},
		{name: "too long", headers: map[string]string{"x-slo-ttft-ms": "1e12"}, bad: HeaderSLOTTFT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got broker.Targets
			reached := false
			h := withSLO(func(w http.ResponseWriter, r *http.Request) { reached, got = true, sloTargets(r) })
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader("{}"))
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h(w, r)
			if tt.bad == "" {
				if !reached || got != tt.want {
					t.Fatalf("reached %v, targets %+v; want %+v", reached, got, tt.want)
				}
				return
			}
			if reached || w.Code != http.StatusBadRequest {
				t.Fatalf("reached %v, status %d; want 400", reached, w.Code)
			}
			var body struct{ Error apiError }
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body.Error.Param == nil || *body.Error.Param != tt.bad || !strings.Contains(body.Error.Message, tt.bad) || body.Error.Type != "invalid_request_error" {
				t.Fatalf("error %+v; want one naming %s", body.Error, tt.bad)
			}
		})
	}
}
