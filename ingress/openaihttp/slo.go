package openaihttp

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/switchyard-ai/switchyard/broker"
)

// The request headers of a request's latency targets, in milliseconds
// (llm-d's names): a positive number, decimals allowed. A target a
// request does not set is the broker's --slo-ttft or --slo-itl.
const (
	HeaderSLOTTFT = "x-slo-ttft-ms"
	HeaderSLOITL  = "x-slo-itl-ms"
)

// maxSLOMillis bounds a target header: a day.
const maxSLOMillis = 24 * 60 * 60 * 1000

// withSLO refuses a request whose target headers are not positive
// numbers of milliseconds, with a 400 naming the header, before h reads
// its body; h then reads them with sloTargets.
func withSLO(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, e := parseSLO(r.Header); e != nil {
			writeError(w, e)
			return
		}
		h(w, r)
	}
}

// sloTargets returns the targets of a request withSLO let through.
func sloTargets(r *http.Request) broker.Targets {
	t, _ := parseSLO(r.Header)
	return t
}

func parseSLO(h http.Header) (broker.Targets, *apiError) {
	var t broker.Targets
	for _, f := range []struct {
		name string
		dst  *time.Duration
	}{{HeaderSLOTTFT, &t.TTFT}, {HeaderSLOITL, &t.ITL}} {
		v := h.Get(f.name)
		if v == "" {
			continue
		}
		ms, err := strconv.ParseFloat(v, 64)
		if err != nil || math.IsNaN(ms) || ms <= 0 || ms > maxSLOMillis {
			return broker.Targets{}, invalid("header "+f.name+": want a positive number of milliseconds (at most a day), got "+strconv.Quote(v), f.name, "invalid_header")
		}
		*f.dst = time.Duration(ms * float64(time.Millisecond))
	}
	return t, nil
}
