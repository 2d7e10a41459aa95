package agent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/agent"
	"github.com/switchyard-ai/switchyard/broker"
	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
	"github.com/switchyard-ai/switchyard/wire"
)

// TestWrongNATSUserNamedInReason: an agent whose NATS user may not bind
// its pool's queue (a user meant for another --role) stays warming, and
// its state reason, which its heartbeats carry to the fleet view, names
// the permission violation rather than a bare timeout.
func TestWrongNATSUserNamedInReason(t *testing.T) {
	opts := natstest.DefaultOptions(t)
	opts.Users = []*server.User{
		{Username: "admin", Password: "a"},
		{Username: "agent", Password: "p", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"$JS.API.CONSUMER.CREATE.>"}},
		}},
	}
	s := natstest.RunServer(t, opts)
	admin, err := nats.Connect(s.ClientURL(), nats.UserInfo("admin", "a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	b, err := broker.New(admin, broker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("agent", "p"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	a, err := agent.New(nc, &countingEngine{}, agent.Config{ID: "a1", Model: "m", Slots: 1, Heartbeat: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent returned %v", err)
		}
	}()
	testwait.For(t, 15*time.Second, 20*time.Millisecond, func() error {
		if st, why := a.State(), a.StateReason(); st != wire.StateWarming || !strings.Contains(why, "permissions violation") || !strings.Contains(why, "--role regular") {
			return fmt.Errorf("state %s, reason %q", st, why)
		}
		return nil
	})
}
