package grpcapi

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchyard-ai/switchyard/broker"
)

func ptr(v float64) *float64 { return &v }

func TestSLOTargets(t *testing.T) {
	tests := []struct {
		name      string
		md        metadata.MD
		ttft, itl *float64
		want      broker.Targets
		bad       string
	}{
		{name: "none", md: metadata.MD{}},
		{name: "both", md: metadata.Pairs(MetadataSLOTTFT, "800", MetadataSLOITL, "20"), want: broker.Targets{TTFT: 800 * time.Millisecond, ITL: 20 * time.Millisecond}},
		{name: "zero", md: metadata.Pairs(MetadataSLOITL, "0"), bad: MetadataSLOITL},
		{name: "word", md: metadata.Pairs(MetadataSLOTTFT, "soon"), bad: MetadataSLOTTFT},
		{name: "twice", md: metadata.Pairs(MetadataSLOTTFT, "5", MetadataSLOTTFT, "6"), bad: MetadataSLOTTFT},
		{name: "fields", ttft: ptr(800.5), itl: ptr(20), want: broker.Targets{TTFT: 800500 * time.Microsecond, ITL: 20 * time.Millisecond}},
		{name: "field wins", md: metadata.Pairs(MetadataSLOTTFT, "5", MetadataSLOITL, "7"), ttft: ptr(800), want: broker.Targets{TTFT: 800 * time.Millisecond, ITL: 7 * time.Millisecond}},
		{name: "field negative", itl: ptr(-1), bad: "slo_itl_ms"},
		{name: "field NaN", ttft: ptr(math.NaN()), bad: "slo_ttft_ms"},
		{name: "field past a day", ttft: ptr(25 * 3600 * 1000), bad: "slo_ttft_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sloTargets(metadata.NewIncomingContext(context.Background(), tt.md), tt.ttft, tt.itl)
			if tt.bad == "" {
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tt.bad) {
				t.Fatalf("err %v; want INVALID_ARGUMENT naming %s", err, tt.bad)
			}
		})
	}
}
