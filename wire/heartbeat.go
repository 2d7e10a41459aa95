package wire

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
)

// Heartbeat states and pools as they appear in heartbeats.
const (
	StateWarming  = "warming"
	StateReady    = "ready"
	StateDraining = "draining"
	// StateStopped is an agent's last heartbeat, sent as it exits with
	// nothing held: brokers take it out of their capacity table at once
	// rather than keep it as a stale entry until it is forgotten. A broker
	// that does not know the state ignores the heartbeat, and the agent
	// goes stale as if it had died.
	StateStopped = "stopped"
)

// ModelPending is the model of the heartbeats of an agent whose engine has
// not yet said which model it serves (started without --model, its engine
// still loading): brokers list such an agent as pending, apart from every
// model, and no request or metric ever names it.
const ModelPending = "(model pending)"

var (
	hbMarshal = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}
	// Unknown fields are discarded so that an older broker reads heartbeats
	// of newer agents.
	hbUnmarshal = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// MarshalHeartbeat renders hb as JSON with snake_case field names. Every
// field is present (zero values included) except the optional engine-load
// fields, which are absent when the engine does not report them.
func MarshalHeartbeat(hb *Heartbeat) ([]byte, error) {
	return hbMarshal.Marshal(hb)
}

// UnmarshalHeartbeat parses a heartbeat published by MarshalHeartbeat, as
// protojson does (unknown fields discarded); the form MarshalHeartbeat
// writes takes a fast path (decodeHeartbeat).
func UnmarshalHeartbeat(data []byte) (*Heartbeat, error) {
	hb := new(Heartbeat)
	if decodeHeartbeat(data, hb) {
		return hb, nil
	}
	hb = new(Heartbeat)
	if err := hbUnmarshal.Unmarshal(data, hb); err != nil {
		return nil, fmt.Errorf("wire: heartbeat: %w", err)
	}
	return hb, nil
}
