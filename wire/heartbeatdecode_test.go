package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// heartbeatVariants are heartbeats as agents send them: the golden one, one
// of a prefill agent with PD fields and prefix counters, one of a warming
// agent (no ready_since, a reason with non-ASCII text) and an empty one.
func heartbeatVariants() []*Heartbeat {
	pd := goldenHeartbeat()
	pd.Pool, pd.PdProtocol, pd.PdLabels, pd.BootstrapHost, pd.BootstrapPort = "prefill", "sglang", "rack=a,zone=b", "10.0.0.7", 8998
	pd.PullLimit, pd.KvEvents = 5, true
	pd.PrefixCacheQueries, pd.PrefixCacheHits = proto.Float64(1.5e9), proto.Float64(3.25e8)
	pd.Interval.Nanos = 250_000_000
	pd.SentAt.Nanos = 123_456_789
	warming := goldenHeartbeat()
	warming.State, warming.StateReason, warming.ReadySince = StateWarming, "engine not healthy yet: connexion refusée", nil
	warming.EngineRunning, warming.EngineWaiting, warming.KvCacheUsage = nil, nil, nil
	return []*Heartbeat{goldenHeartbeat(), pd, warming, {}}
}

// TestHeartbeatFastPath checks that what MarshalHeartbeat writes takes the
// fast path and decodes to the heartbeat it came from.
func TestHeartbeatFastPath(t *testing.T) {
	for i, want := range heartbeatVariants() {
		data, err := MarshalHeartbeat(want)
		if err != nil {
			t.Fatal(err)
		}
		var got Heartbeat
		if !decodeHeartbeat(data, &got) {
			t.Fatalf("variant %d: fast path refused %s", i, data)
		}
		if !proto.Equal(&got, want) {
			t.Fatalf("variant %d: got %v, want %v", i, &got, want)
		}
	}
}

// TestHeartbeatSlowPath checks forms the fast path leaves to protojson.
func TestHeartbeatSlowPath(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		slots      uint32
	}{
		{"lowerCamel name", `{"agentId":"a","slots":4}`, 4},
		{"number as string", `{"slots":"4"}`, 4},
		{"escape", `{"agent_id":"a\u0062","slots":4}`, 4},
		{"nested unknown", `{"future":{"x":[1,2]},"slots":4}`, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hb Heartbeat
			if decodeHeartbeat([]byte(tc.data), &hb) {
				t.Fatal("fast path took it")
			}
			got, err := UnmarshalHeartbeat([]byte(tc.data))
			if err != nil {
				t.Fatal(err)
			}
			if got.GetSlots() != tc.slots {
				t.Fatalf("slots %d, want %d", got.GetSlots(), tc.slots)
			}
		})
	}
}

// FuzzUnmarshalHeartbeat checks that UnmarshalHeartbeat decodes any input
// exactly as protojson does: the same heartbeat, or an error for both.
func FuzzUnmarshalHeartbeat(f *testing.F) {
	for _, hb := range heartbeatVariants() {
		data, err := MarshalHeartbeat(hb)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		`{}`, ` { "slots" : 4 , "seq":1 } `, `{"slots":4,"slots":5}`, `{"slots":01}`, `{"slots":4294967296}`,
		`{"slots":-1}`, `{"slots":1e2}`, `{"slots":null}`, `{"kv_cache_usage":"NaN"}`, `{"kv_cache_usage":1e400}`,
		`{"kv_cache_usage":-0.0}`, `{"interval":"+1s"}`, `{"interval":".5s"}`, `{"interval":"-0.5s"}`,
		`{"interval":"315576000001s"}`, `{"sent_at":"2026-12-02T10:00:00+01:00"}`, `{"sent_at":"2026-12-02T10:00:00.1234567891Z"}`,
		`{"sent_at":"10000-01-01T00:00:00Z"}`, `{"x":"\u00e9","y":[],"z":true}`, `{"[a.b]":1}`, `{"agent_id":"\xff"}`,
		`{"kv_events":true}{}`, `{"seq":1,}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gerr := UnmarshalHeartbeat(data)
		want := new(Heartbeat)
		werr := hbUnmarshal.Unmarshal(data, want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: error %v, protojson's %v", data, gerr, werr)
		}
		if gerr == nil && !proto.Equal(got, want) {
			t.Fatalf("%q: got %v, protojson %v", data, got, want)
		}
	})
}

func BenchmarkUnmarshalHeartbeat(b *testing.B) {
	data, err := MarshalHeartbeat(heartbeatVariants()[1])
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decoder=wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := UnmarshalHeartbeat(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decoder=protojson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := hbUnmarshal.Unmarshal(data, new(Heartbeat)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
