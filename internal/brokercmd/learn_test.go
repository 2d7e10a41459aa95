package brokercmd

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-ai/switchyard/internal/natstest"
	"github.com/switchyard-ai/switchyard/internal/testwait"
)

const learnSubj = "sy.learn.m.regular.b1"

// brokerConn connects to ns as the command connects its broker (in
// process, no echo) and subscribes to every broker's learn messages.
func brokerConn(t *testing.T, ns *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return subscribeLearn(t, ns.ClientURL(), append([]nats.Option{nats.InProcessServer(ns), nats.NoEcho()}, opts...)...)
}

// subscribeLearn connects to url and subscribes to every broker's learn
// messages; the subscription is known to the server when it returns.
func subscribeLearn(t *testing.T, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe("sy.learn.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return nc
}

func waitInterest(t *testing.T, f func(string) int, want int) {
	t.Helper()
	testwait.For(t, 10*time.Second, 5*time.Millisecond, func() error {
		if n := f(learnSubj); n != want {
			return fmt.Errorf("interest %d, want %d", n, want)
		}
		return nil
	})
}

// The broker's learn listeners are counted in its own account: its own
// subscription alone, then a peer's on the same server, one on another
// server of the cluster, and not a subscriber of another account.
func TestAccountInterest(t *testing.T) {
	if accountInterest(nil, nil) != nil {
		t.Fatal("a count without an embedded server")
	}
	t.Run("one server", func(t *testing.T) {
		ns := natstest.RunJetStream(t)
		f := accountInterest(ns, brokerConn(t, ns))
		if f == nil {
			t.Fatal("no count")
		}
		waitInterest(t, f, 1)
		subscribeLearn(t, ns.ClientURL())
		waitInterest(t, f, 2)
	})
	t.Run("accounts", func(t *testing.T) {
		opts := natstest.DefaultOptions(t)
		a, other := server.NewAccount("A"), server.NewAccount("B")
		opts.Accounts = []*server.Account{a, other}
		opts.Users = []*server.User{{Username: "broker", Password: "p", Account: a}, {Username: "peer", Password: "p", Account: a}, {Username: "stranger", Password: "p", Account: other}}
		ns := natstest.RunServer(t, opts)
		f := accountInterest(ns, brokerConn(t, ns, nats.UserInfo("broker", "p")))
		subscribeLearn(t, ns.ClientURL(), nats.UserInfo("stranger", "p"))
		waitInterest(t, f, 1)
		subscribeLearn(t, ns.ClientURL(), nats.UserInfo("peer", "p"))
		waitInterest(t, f, 2)
	})
	t.Run("cluster", func(t *testing.T) {
		c := natstest.RunCluster(t, "learn", 2)
		f := accountInterest(c.Servers[0], brokerConn(t, c.Servers[0]))
		waitInterest(t, f, 1)
		subscribeLearn(t, c.URL(1))
		waitInterest(t, f, 2)
	})
}
