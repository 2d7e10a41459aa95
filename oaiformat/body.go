package oaiformat

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/switchyard-ai/switchyard/oaiformat/jsonscan"
)

// Member is one top-level member of a request body: its key and its JSON
// value as it is to be written.
type Member struct {
	Key   string
	Value []byte
}

// Edit says how a body's top-level members change.
type Edit struct {
	// Drop removes every member with one of these keys.
	Drop []string
	// Set replaces every member with the key (or adds one), after the
	// body's other members, in order.
	Set []Member
	// SetIfPresent replaces the members with the key the body has, and
	// adds nothing for the ones it does not have.
	SetIfPresent []Member
	// StreamOptions sets "stream_options" to the body's own object (when
	// it is one) with include_usage true: the agent needs the usage chunk,
	// and what else the client asked of the stream (vLLM's
	// continuous_usage_stats) is the client's.
	StreamOptions bool
}

func (e *Edit) owns(key string) bool {
	if slices.Contains(e.Drop, key) || (e.StreamOptions && key == "stream_options") {
		return true
	}
	for _, m := range e.Set {
		if m.Key == key {
			return true
		}
	}
	for _, m := range e.SetIfPresent {
		if m.Key == key {
			return true
		}
	}
	return false
}

// Rewrite applies e to body in one validating pass: the members e does not
// touch are copied as they were written, byte for byte. body must be one
// JSON object; the result is a new slice.
func Rewrite(body []byte, e *Edit) ([]byte, error) {
	n := len(body) + 2
	if e.StreamOptions {
		n += len(`,"stream_options":{"include_usage":true}`)
	}
	for _, m := range e.Set {
		n += len(m.Key) + len(m.Value) + 4
	}
	for _, m := range e.SetIfPresent {
		n += len(m.Key) + len(m.Value) + 4
	}
	out := make([]byte, 1, n)
	out[0] = '{'
	quoted := false
	var present []bool // of SetIfPresent, allocated only when used
	var so []byte      // the body's last stream_options
	err := jsonscan.Members(body, func(key []byte, q bool, member, value []byte) {
		if q {
			quoted = true
			return
		}
		// string(key) in a comparison does not allocate.
		for i, m := range e.SetIfPresent {
			if string(key) == m.Key {
				if present == nil {
					present = make([]bool, len(e.SetIfPresent))
				}
				present[i] = true
			}
		}
		if e.StreamOptions && string(key) == "stream_options" {
			so = value
		}
		if e.owns(string(key)) {
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, member...)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotObject, err)
	}
	if quoted {
		// A key with escapes may spell an owned key another way: compare
		// keys as the engine will read them.
		return rewriteDecoded(body, e)
	}
	put := func(key string, value []byte) {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = AppendString(out, key)
		out = append(out, ':')
		out = append(out, value...)
	}
	for _, m := range e.Set {
		put(m.Key, m.Value)
	}
	for i, m := range e.SetIfPresent {
		if present != nil && present[i] {
			put(m.Key, m.Value)
		}
	}
	if e.StreamOptions {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, `"stream_options":`...)
		if out, err = appendStreamOptions(out, so); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

var includeUsage = []byte(`{"include_usage":true}`)

// mergeStreamOptions returns the object so (a JSON value or nil) with
// include_usage true and its other members kept.
func mergeStreamOptions(so []byte) ([]byte, error) {
	return appendStreamOptions(make([]byte, 0, len(so)+len(includeUsage)), so)
}

// appendStreamOptions appends mergeStreamOptions(so) to out, so that the
// streaming body costs one allocation.
func appendStreamOptions(out, so []byte) ([]byte, error) {
	if len(so) == 0 || so[0] != '{' {
		return append(out, includeUsage...), nil // absent, null, or not an object: ours
	}
	start := len(out)
	out = append(out, '{')
	quoted := false
	err := jsonscan.Members(so, func(key []byte, q bool, member, _ []byte) {
		if q {
			quoted = true
			return
		}
		if string(key) == "include_usage" {
			return
		}
		out = append(out, member...)
		out = append(out, ',')
	})
	if err != nil {
		return nil, fmt.Errorf("%w: stream_options: %w", ErrNotObject, err)
	}
	if quoted {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(so, &m); err != nil {
			return nil, fmt.Errorf("%w: stream_options: %w", ErrNotObject, err)
		}
		m["include_usage"] = json.RawMessage("true")
		v, err := json.Marshal(m)
		if err != nil {
			return nil, err
		}
		return append(out[:start], v...), nil
	}
	return append(out, `"include_usage":true}`...), nil
}

// rewriteDecoded is Rewrite through encoding/json, for bodies whose keys
// need unquoting; the tests hold Rewrite to it.
func rewriteDecoded(body []byte, e *Edit) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotObject, err)
	}
	if m == nil {
		return nil, fmt.Errorf("%w: null", ErrNotObject)
	}
	so := m["stream_options"]
	has := make([]bool, len(e.SetIfPresent))
	for i, s := range e.SetIfPresent {
		_, has[i] = m[s.Key]
	}
	for k := range m {
		if e.owns(k) {
			delete(m, k)
		}
	}
	for _, s := range e.Set {
		m[s.Key] = s.Value
	}
	for i, s := range e.SetIfPresent {
		if has[i] {
			m[s.Key] = s.Value
		}
	}
	if e.StreamOptions {
		v, err := mergeStreamOptions(so)
		if err != nil {
			return nil, err
		}
		m["stream_options"] = v
	}
	return json.Marshal(m)
}

// streaming is the edit of every body the agent streams from its engine:
// a stream with the usage chunk, and never a hand-off field of the
// client's (the ingress refuses them; an engine must not see one either
// way).
var streaming = Edit{
	Drop:          HandoffFields,
	Set:           []Member{{"stream", []byte("true")}},
	StreamOptions: true,
}

// StreamingBody returns body as the agent sends it to its engine: "stream"
// true and "stream_options" merged with include_usage true.
func StreamingBody(body []byte) ([]byte, error) {
	return Rewrite(body, &streaming)
}

// VLLMPrefillParams asks a vLLM prefill engine to keep the KV cache for a
// remote decode, as vLLM's own disaggregation proxy does.
var VLLMPrefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// vllmPrefill is the prefill leg as vLLM's proxy
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) builds it:
// one token, no stream and no stream_options, min_tokens and
// min_completion_tokens dropped (vLLM refuses them beside max_tokens 1),
// max_completion_tokens 1 when the client set it.
var vllmPrefill = Edit{
	Drop: append(slices.Clone(HandoffFields), "stream_options", "min_tokens", "min_completion_tokens"),
	Set: []Member{
		{"kv_transfer_params", VLLMPrefillParams},
		{"stream", []byte("false")},
		{"max_tokens", []byte("1")},
	},
	SetIfPresent: []Member{{"max_completion_tokens", []byte("1")}},
}

// VLLMPrefillBody returns the vLLM prefill leg of a client's body.
func VLLMPrefillBody(body []byte) ([]byte, error) {
	return Rewrite(body, &vllmPrefill)
}

// VLLMDecodeBody returns the vLLM decode leg of a client's body: the
// streaming body with the prefill's kv_transfer_params.
func VLLMDecodeBody(body, kvTransferParams []byte) ([]byte, error) {
	e := streaming
	e.Set = []Member{{"stream", []byte("true")}, {"kv_transfer_params", kvTransferParams}}
	return Rewrite(body, &e)
}

// SGLangBody returns an SGLang PD leg of a client's body: the streaming
// body with the bootstrap server and room. SGLang's router sends the same
// request to both legs.
func SGLangBody(body []byte, host string, port uint32, room uint64) ([]byte, error) {
	e := streaming
	e.Set = []Member{
		{"stream", []byte("true")},
		{"bootstrap_host", AppendString(nil, host)},
		{"bootstrap_port", strconv.AppendUint(nil, uint64(port), 10)},
		// A JSON integer, never a float: rooms use 63 bits.
		{"bootstrap_room", strconv.AppendUint(nil, room, 10)},
	}
	return Rewrite(body, &e)
}
