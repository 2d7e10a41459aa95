package agent_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// failingEngine fails every chat and embeddings request with err.
type failingEngine struct{ err error }

func (e failingEngine) Stream(context.Context, *agent.Request, agent.Emit) error { return e.err }

func (e failingEngine) Embed(context.Context, *agent.Request) (int, []byte, error) {
	return 0, nil, e.err
}

// TestEngineFailureSameForChatAndEmbeddings runs a chat and an
// embeddings job on an engine that fails, through the agent's pull, and
// checks that both end with the same error chunk: a failure no adapter
// classified is engine_error, and an adapter's own code is kept.
func TestEngineFailureSameForChatAndEmbeddings(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code string
	}{
		{"unclassified", errors.New("engine broke"), wire.CodeEngine},
		{"adapter's code", &wire.Error{Code: wire.CodeEngineDown, Message: "dial refused"}, wire.CodeEngineDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, anc := jobsServer(t)
			a, err := agent.New(anc, failingEngine{tc.err}, agent.Config{ID: "a1", Model: "m", Slots: 2,
				Heartbeat: 50 * time.Millisecond, PullWait: 200 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("agent returned %v", err)
				}
			})
			testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
				if st := a.State(); st != wire.StateReady {
					return fmt.Errorf("agent is %s", st)
				}
				return nil
			})
			js, _ := jetstream.New(nc)
			for _, api := range []wire.API{wire.API_API_CHAT, wire.API_API_EMBEDDINGS} {
				id := "r-" + api.String()
				reply := "sy.reply.test." + id
				sub, err := nc.SubscribeSync(reply)
				if err != nil {
					t.Fatal(err)
				}
				body := `{"messages":[{"role":"user","content":"x"}]}`
				if api == wire.API_API_EMBEDDINGS {
					body = `{"input":"x"}`
				}
				job, _ := proto.Marshal(&wire.Job{RequestId: id, Model: "m", Api: api, Body: []byte(body),
					ReplySubject: reply, Deadline: timestamppb.New(time.Now().Add(time.Minute))})
				if _, err := js.Publish(context.Background(), "sy.jobs.m.regular", job); err != nil {
					t.Fatal(err)
				}
				c := next(t, sub)
				for c.GetKind() == wire.Chunk_KIND_ACCEPTED || c.GetKind() == wire.Chunk_KIND_KEEPALIVE {
					c = next(t, sub)
				}
				if c.GetKind() != wire.Chunk_KIND_ERROR {
					t.Fatalf("%s: chunk %v, want an error", api, c.GetKind())
				}
				if got := c.GetError().GetCode(); got != tc.code {
					t.Errorf("%s: error code %q, want %q", api, got, tc.code)
				}
				if !c.GetError().GetRetryable() {
					t.Errorf("%s: error not retryable: the client saw nothing and the engine did not judge the request", api)
				}
			}
		})
	}
}
