package brokercmd

import (
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// accountInterest returns broker.Config.LearnListeners for a broker whose
// connection nc is to the embedded server ns: the subscriptions a message
// would reach in the connection's account, which take in those of peers
// on other servers of a cluster and of leaf nodes. Nil when that account
// cannot be found, or when the server has gateways, whose remote interest
// is not counted there.
func accountInterest(ns *server.Server, nc *nats.Conn) func(subject string) int {
	if ns == nil || ns.GatewayAddr() != nil {
		return nil
	}
	cid, err := nc.GetClientID()
	if err != nil {
		return nil
	}
	c := ns.GetClient(cid)
	if c == nil {
		return nil
	}
	acc := c.Account()
	if acc == nil {
		return nil
	}
	return acc.Interest
}
