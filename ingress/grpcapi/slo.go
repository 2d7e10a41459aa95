package grpcapi

import (
	"context"
	"math"
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/switchyard-ai/switchyard/broker"
)

// The request metadata of a request's latency targets, in milliseconds,
// as the HTTP ingress's headers (llm-d's names): a positive number,
// decimals allowed. The request's own slo_ttft_ms and slo_itl_ms fields
// win over them; a target set by neither is the broker's --slo-ttft or
// --slo-itl.
const (
	MetadataSLOTTFT = "x-slo-ttft-ms"
	MetadataSLOITL  = "x-slo-itl-ms"
)

// maxSLOMillis bounds a target: a day.
const maxSLOMillis = 24 * 60 * 60 * 1000

// sloTargets reads the request's targets from its fields ttftMs and itlMs
// (nil when unset) or else its metadata; a value that is not a positive
// number of milliseconds is INVALID_ARGUMENT naming the field or key.
func sloTargets(ctx context.Context, ttftMs, itlMs *float64) (broker.Targets, error) {
	var t broker.Targets
	md, _ := metadata.FromIncomingContext(ctx)
	for _, f := range []struct {
		field, key string
		value      *float64
		dst        *time.Duration
	}{{"slo_ttft_ms", MetadataSLOTTFT, ttftMs, &t.TTFT}, {"slo_itl_ms", MetadataSLOITL, itlMs, &t.ITL}} {
		if f.value != nil {
			if !validSLO(*f.value) {
				return broker.Targets{}, invalid("%s: want a positive number of milliseconds (at most a day), got %v", f.field, *f.value)
			}
			*f.dst = time.Duration(*f.value * float64(time.Millisecond))
			continue
		}
		vs := md.Get(f.key)
		if len(vs) == 0 {
			continue
		}
		ms, err := strconv.ParseFloat(vs[0], 64)
		if err != nil || !validSLO(ms) || len(vs) > 1 {
			return broker.Targets{}, invalid("metadata %s: want one positive number of milliseconds (at most a day), got %q", f.key, vs)
		}
		*f.dst = time.Duration(ms * float64(time.Millisecond))
	}
	return t, nil
}

func validSLO(ms float64) bool { return !math.IsNaN(ms) && ms > 0 && ms <= maxSLOMillis }
