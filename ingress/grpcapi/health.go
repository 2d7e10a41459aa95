package grpcapi

import (
	"context"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
)

// healthService is grpc-go's health server with its status kept equal to
// the backend's readiness: refreshed on every Check and List, and on a
// ticker while a Watch is open. The overall status ("") and the Switchyard
// service's are the same.
type healthService struct {
	*health.Server
	ready    func() error
	interval time.Duration
}

func newHealthService(ready func() error, interval time.Duration) *healthService {
	h := &healthService{Server: health.NewServer(), ready: ready, interval: interval}
	h.refresh()
	return h
}

// refresh sets the status from the backend; the health server notifies
// watchers only on a change, and ignores it after Shutdown.
func (h *healthService) refresh() {
	st := healthpb.HealthCheckResponse_SERVING
	if h.ready() != nil {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	h.SetServingStatus("", st)
	h.SetServingStatus(switchyardv1.Switchyard_ServiceDesc.ServiceName, st)
}

func (h *healthService) Check(ctx context.Context, in *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.refresh()
	return h.Server.Check(ctx, in)
}

func (h *healthService) List(ctx context.Context, in *healthpb.HealthListRequest) (*healthpb.HealthListResponse, error) {
	h.refresh()
	return h.Server.List(ctx, in)
}

func (h *healthService) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	h.refresh()
	go func() {
		t := time.NewTicker(h.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				h.refresh()
			}
		}
	}()
	return h.Server.Watch(in, stream)
}
