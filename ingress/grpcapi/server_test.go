package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	switchyardv1 "github.com/switchyard-ai/switchyard/api/switchyard/v1"
	"github.com/switchyard-ai/switchyard/broker"
)

// fakeBackend fails every Submit with err: a *broker.Call cannot be made
// outside package broker, so streams are tested end to end in e2e_test.go.
type fakeBackend struct {
	err      error
	notReady atomic.Bool
	models   []string
	last     atomic.Pointer[broker.Request] // the last request submitted
}

func (f *fakeBackend) Submit(_ context.Context, req broker.Request) (*broker.Call, error) {
	f.last.Store(&req)
	return nil, f.err
}

func (f *fakeBackend) Models() []string { return f.models }

func (f *fakeBackend) Ready() error {
	if f.notReady.Load() {
		return errors.New("not ready")
	}
	return nil
}

func TestSubmitErrors(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		code  codes.Code
		retry bool // carries RetryInfo
	}{
		{"no model", broker.ErrNoModel, codes.InvalidArgument, false},
		{"unknown model", fmt.Errorf("%w %q", broker.ErrUnknownModel, "x"), codes.NotFound, false},
		{"queue full", fmt.Errorf("%w: sy.jobs.m.regular", broker.ErrQueueFull), codes.ResourceExhausted, true},
		{"no capacity", fmt.Errorf("%w %q", broker.ErrNoCapacity, "m"), codes.Unavailable, true},
		{"unsupported", broker.ErrUnsupported, codes.Unavailable, true},
		{"not connected", broker.ErrNotConnected, codes.Unavailable, true},
		{"closed", broker.ErrClosed, codes.Unavailable, true},
		{"timeout", broker.ErrTimeout, codes.DeadlineExceeded, false},
		{"other", errors.New("boom"), codes.Internal, false},
	}
	fb := &fakeBackend{}
	client := switchyardv1.NewSwitchyardClient(serve(t, New(fb, Config{}), Config{}))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb.err = tt.err
			ctx := metadata.AppendToOutgoingContext(t.Context(), "x-request-id", "req-"+tt.code.String())
			stream, err := client.Chat(ctx, &switchyardv1.ChatRequest{Model: "m", Messages: user("hi")})
			if err != nil {
				t.Fatal(err)
			}
			_, err = stream.Recv()
			st, _ := status.FromError(err)
			if st.Code() != tt.code {
				t.Fatalf("code %s (%v), want %s", st.Code(), err, tt.code)
			}
			hasRetry := false
			for _, d := range st.Details() {
				if _, ok := d.(*errdetails.RetryInfo); ok {
					hasRetry = true
				}
			}
			if hasRetry != tt.retry {
				t.Errorf("RetryInfo %v, want %v", hasRetry, tt.retry)
			}
			md, err := stream.Header()
			if err != nil {
				t.Fatal(err)
			}
			if got := md.Get(HeaderRequestID); len(got) != 1 || got[0] != "req-"+tt.code.String() {
				t.Errorf("x-request-id %q, want the client's", got)
			}
		})
	}
}

// TestNoMigrationWithTools: tools declared through extra_json mark the
// request, so a broken stream is not continued from its text alone.
func TestNoMigrationWithTools(t *testing.T) {
	fb := &fakeBackend{err: broker.ErrClosed}
	client := switchyardv1.NewSwitchyardClient(serve(t, New(fb, Config{}), Config{}))
	for extra, want := range map[string]string{
		``:             "",
		`{"top_k":2}`:  "",
		`{"tools":[]}`: "",
		`{"tools":[{"type":"function","function":{"name":"f"}}]}`: "tools",
		`{"functions":[{"name":"f"}]}`:                            "tools",
	} {
		stream, err := client.Chat(t.Context(), &switchyardv1.ChatRequest{Model: "m", Messages: user("hi"), ExtraJson: extra})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("extra %s: got %v, want Unavailable", extra, err)
		}
		if got := fb.last.Load().NoMigration; got != want {
			t.Errorf("extra %s: NoMigration %q, want %q", extra, got, want)
		}
	}
}

func TestRequestIDGenerated(t *testing.T) {
	client := switchyardv1.NewSwitchyardClient(serve(t, New(&fakeBackend{err: broker.ErrClosed}, Config{}), Config{}))
	for _, sent := range []string{"", "has space", strings.Repeat("a", 129)} {
		ctx := t.Context()
		if sent != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-request-id", sent)
		}
		var header metadata.MD
		stream, err := client.Complete(ctx, &switchyardv1.CompletionRequest{Prompt: "x"}, grpc.Header(&header))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
			t.Fatalf("got %v, want Unavailable", err)
		}
		got := header.Get(HeaderRequestID)
		if len(got) != 1 || len(got[0]) != 24 || got[0] == sent {
			t.Errorf("sent %q: x-request-id %q, want a generated one", sent, got)
		}
	}
}

func TestHealth(t *testing.T) {
	fb := &fakeBackend{}
	srv := New(fb, Config{HealthInterval: 10 * time.Millisecond})
	hc := healthpb.NewHealthClient(serve(t, srv, Config{}))
	check := func(service string, want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetStatus() != want {
			t.Errorf("service %q: %s, want %s", service, resp.GetStatus(), want)
		}
	}
	svc := switchyardv1.Switchyard_ServiceDesc.ServiceName
	check("", healthpb.HealthCheckResponse_SERVING)
	check(svc, healthpb.HealthCheckResponse_SERVING)
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}

	watch, err := hc.Watch(t.Context(), &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v %v, want SERVING", r, err)
	}
	// The watcher learns of the change from the ticker, with no Check.
	fb.notReady.Store(true)
	if r, err := watch.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch: %v %v, want NOT_SERVING", r, err)
	}
	check("", healthpb.HealthCheckResponse_NOT_SERVING)
	fb.notReady.Store(false)
	check(svc, healthpb.HealthCheckResponse_SERVING)

	srv.Shutdown()
	check("", healthpb.HealthCheckResponse_NOT_SERVING)
	check(svc, healthpb.HealthCheckResponse_NOT_SERVING)
}

func TestListModelsEmpty(t *testing.T) {
	client := switchyardv1.NewSwitchyardClient(serve(t, New(&fakeBackend{}, Config{}), Config{}))
	resp, err := client.ListModels(t.Context(), &switchyardv1.ListModelsRequest{})
	if err != nil || len(resp.GetModels()) != 0 {
		t.Fatalf("got %v %v, want no models", resp, err)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
	if err := (Config{MaxRecvMsgSize: -1}).Validate(); err == nil {
		t.Error("negative size accepted")
	}
}

func TestMaxRecvMsgSize(t *testing.T) {
	cfg := Config{MaxRecvMsgSize: 1024}
	client := switchyardv1.NewSwitchyardClient(serve(t, New(&fakeBackend{err: broker.ErrClosed}, cfg), cfg))
	stream, err := client.Complete(t.Context(), &switchyardv1.CompletionRequest{Prompt: string(make([]byte, 2048))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("got %v, want ResourceExhausted for a message over the limit", err)
	}
}
