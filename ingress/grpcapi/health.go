package grpcapi

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
)

// healthService is grpc-go's health server with its status kept equal to
// the backend's readiness: refreshed on every Check and List, and by one
// ticker while any Watch is open. The overall status ("") and the
// Switchyard service's are the same.
//
// Watch needs no key, and a Watch stream lasts as long as its client
// wants: at most maxWatches are open at once, and WatchesPerConn on one
// connection.
type healthService struct {
	*health.Server
	ready      func() error
	interval   time.Duration
	maxWatches int

	mu      sync.Mutex
	watches int
	byConn  map[string]int
	stop    chan struct{} // closed when the last Watch ends; nil while none is open
}

func newHealthService(ready func() error, interval time.Duration, maxWatches int) *healthService {
	h := &healthService{Server: health.NewServer(), ready: ready, interval: interval, maxWatches: maxWatches, byConn: map[string]int{}}
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
	conn := ""
	if p, ok := peer.FromContext(stream.Context()); ok && p.Addr != nil {
		conn = p.Addr.String()
	}
	if err := h.enter(conn); err != nil {
		return err
	}
	defer h.leave(conn)
	h.refresh()
	return h.Server.Watch(in, stream)
}

// enter counts a Watch of connection conn in, or refuses it; the first
// open Watch starts the ticker.
func (h *healthService) enter(conn string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watches >= h.maxWatches {
		return status.Errorf(codes.ResourceExhausted, "the broker has %d health watches open, as many as it allows (--grpc-max-watches); use Check", h.watches)
	}
	if h.byConn[conn] >= WatchesPerConn {
		return status.Errorf(codes.ResourceExhausted, "this connection has %d health watches open, as many as the broker allows one connection", WatchesPerConn)
	}
	h.watches++
	h.byConn[conn]++
	if h.stop == nil {
		h.stop = make(chan struct{})
		go h.tick(h.stop)
	}
	return nil
}

// leave counts a Watch out; the last one stops the ticker.
func (h *healthService) leave(conn string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watches--
	if n := h.byConn[conn] - 1; n > 0 {
		h.byConn[conn] = n
	} else {
		delete(h.byConn, conn)
	}
	if h.watches == 0 {
		close(h.stop)
		h.stop = nil
	}
}

// tick refreshes the status every interval until stop is closed.
func (h *healthService) tick(stop chan struct{}) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			h.refresh()
		}
	}
}

// openWatches is the number of Watch streams open.
func (h *healthService) openWatches() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.watches
}
