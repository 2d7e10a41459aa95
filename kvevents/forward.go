package kvevents

import (
	"encoding/json"
	"fmt"
)

// Forward is what an agent publishes on NATS per batch of its engine's KV
// events (subjects.KV): the batch's Summary, whose block hashes are the
// broker's block keys (see docs/affinity.md), plus Resync, which tells
// the brokers to forget what the agent reported before. JSON, so that
// `nats sub 'sy.kv.>'` stays readable.
type Forward struct {
	Seq     uint64   `json:"seq"`
	Resync  bool     `json:"resync,omitempty"`
	Cleared bool     `json:"cleared,omitempty"`
	Stored  []uint64 `json:"stored,omitempty"`
	Removed []uint64 `json:"removed,omitempty"`
}

// ForwardOf returns u's Forward.
func ForwardOf(u Update) Forward {
	return Forward{Seq: u.Seq, Resync: u.Resync, Cleared: u.Summary.Cleared, Stored: u.Summary.Stored, Removed: u.Summary.Removed}
}

// Marshal encodes f.
func (f Forward) Marshal() ([]byte, error) { return json.Marshal(f) }

// UnmarshalForward decodes a Forward.
func UnmarshalForward(data []byte) (Forward, error) {
	var f Forward
	if err := json.Unmarshal(data, &f); err != nil {
		return Forward{}, fmt.Errorf("%w: forward: %v", ErrFormat, err)
	}
	return f, nil
}
