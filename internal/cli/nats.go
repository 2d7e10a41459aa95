package cli

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// NATSOptions are the connection options both commands use: reconnect
// forever (a NATS restart or a cluster failover must not end a broker or an
// agent), quickly, and say so in the log.
func NATSOptions(log *slog.Logger, name string) []nats.Option {
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "conn", name, "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("NATS reconnected", "conn", name, "url", c.ConnectedUrlRedacted())
		}),
	}
}
