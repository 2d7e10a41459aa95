package kvevents

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// DefaultEndpoint is vLLM's default publisher endpoint.
const DefaultEndpoint = "tcp://*:5557"

// Config is the part of vLLM's --kv-events-config JSON that a publisher
// needs; other keys (replay_endpoint, buffer_steps, hwm, max_queue_size)
// are accepted and ignored.
type Config struct {
	Enabled bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null" (events made but not sent); empty means
	// "zmq" once enabled.
	Publisher string `json:"publisher"`
	// Endpoint is where the PUB socket binds, "tcp://host:port"; port 0
	// picks a free one ([Publisher.Endpoint] tells which).
	Endpoint string `json:"endpoint"`
	// Topic is the first frame of every message.
	Topic string `json:"topic"`
}

// ErrConfig matches every configuration error.
var ErrConfig = errors.New("kvevents: invalid config")

// ParseConfig reads a --kv-events-config value. An empty string is the
// zero Config: events off.
func ParseConfig(s string) (Config, error) {
	var c Config
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.Enabled && c.Publisher == "" {
		c.Publisher = "zmq"
	}
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	return c, c.Validate()
}

// Publishes tells whether events go out on a socket.
func (c Config) Publishes() bool { return c.Enabled && c.Publisher == "zmq" }

// Validate reports an unknown publisher or an endpoint that is not TCP.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	switch c.Publisher {
	case "zmq", "null":
	default:
		return fmt.Errorf("%w: publisher %q, want zmq or null", ErrConfig, c.Publisher)
	}
	if c.Publisher == "zmq" && !strings.HasPrefix(c.Endpoint, "tcp://") {
		return fmt.Errorf("%w: endpoint %q, want tcp://host:port", ErrConfig, c.Endpoint)
	}
	return nil
}
