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
// decimals allowed. A target a request does not set is the broker's
// --slo-ttft or --slo-itl.
const (
	MetadataSLOTTFT = "x-slo-ttft-ms"
	MetadataSLOITL  = "x-slo-itl-ms"
)

// maxSLOMillis bounds a target: a day.
const maxSLOMillis = 24 * 60 * 60 * 1000

// sloTargets reads the request's target metadata; a value that is not a
// positive number of milliseconds is INVALID_ARGUMENT naming the key.
func sloTargets(ctx context.Context) (broker.Targets, error) {
	var t broker.Targets
	md, _ := metadata.FromIncomingContext(ctx)
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{{MetadataSLOTTFT, &t.TTFT}, {MetadataSLOITL, &t.ITL}} {
		vs := md.Get(f.key)
		if len(vs) == 0 {
			continue
		}
		ms, err := strconv.ParseFloat(vs[0], 64)
		if err != nil || math.IsNaN(ms) || ms <= 0 || ms > maxSLOMillis || len(vs) > 1 {
			return broker.Targets{}, invalid("metadata %s: want one positive number of milliseconds (at most a day), got %q", f.key, vs)
		}
		*f.dst = time.Duration(ms * float64(time.Millisecond))
	}
	return t, nil
}
